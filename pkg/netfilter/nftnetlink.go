package netfilter

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/nlmsg"
)

// The nftables rules this package releases (bridge's ipMasq rules, portmap's
// hostport rules) are listed and deleted over the probe's raw netlink
// socket: the whole client is a rule dump and a batch of deletions by
// handle, what `nft delete rule ... handle N` sends. A general client
// (google/nftables and the netlink packages under it) was linked for just
// that, and every verb paid its package init and its share of the binary's
// page faults at start-up (BENCHMARKS.md, "Cold start").

// nftRule is one rule of a dump, its attributes read in place: valid only
// during the callback that gets it.
type nftRule struct {
	table, chain []byte
	handle       uint64
	userdata     []byte
	// exprs is the payload of NFTA_RULE_EXPRESSIONS: a list of
	// NFTA_LIST_ELEM, each an expression's name and data.
	exprs []byte
}

// parseNFTRule reads one NFT_MSG_NEWRULE's attributes (after the nfgenmsg);
// ok is false when they are not well formed.
func parseNFTRule(b []byte) (r nftRule, ok bool) {
	ok = nlmsg.EachAttr(b, func(typ uint16, data []byte) {
		switch typ {
		case unix.NFTA_RULE_TABLE:
			r.table = cString(data)
		case unix.NFTA_RULE_CHAIN:
			r.chain = cString(data)
		case unix.NFTA_RULE_HANDLE:
			if len(data) == 8 {
				r.handle = binary.BigEndian.Uint64(data)
			}
		case unix.NFTA_RULE_USERDATA:
			r.userdata = data
		case unix.NFTA_RULE_EXPRESSIONS:
			r.exprs = data
		}
	})
	return r, ok
}

// eachRule dumps the rules of chain in table (every chain of the table
// when chain is ""), nftables family family, and calls fn with each. A
// table or chain that does not exist has no rules. A dump the ruleset
// changed under (NLM_F_DUMP_INTR) or a malformed rule is an error, once
// the dump is read to its end.
func (c *probeConn) eachRule(family byte, table, chain string, fn func(*nftRule)) error {
	c.Seq++
	seq := c.Seq
	req := make([]byte, unix.NLMSG_HDRLEN, 64)
	req = append(req, family, unix.NFNETLINK_V0, 0, 0) // nfgenmsg
	req = nlmsg.AppendStringAttr(req, unix.NFTA_RULE_TABLE, table)
	if chain != "" {
		req = nlmsg.AppendStringAttr(req, unix.NFTA_RULE_CHAIN, chain)
	}
	nlmsg.PutHeader(req, unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETRULE, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, seq)
	if err := c.Send(req); err != nil {
		return err
	}
	var dumpErr error
	return c.Receive(func(h *unix.NlMsghdr, msg []byte) (bool, error) {
		if h.Seq != seq {
			return false, nil // an answer to an earlier request
		}
		switch h.Type {
		case unix.NLMSG_DONE:
			return true, dumpErr
		case unix.NLMSG_ERROR:
			errno, err := nlmsg.Errno(msg)
			switch {
			case err != nil:
				return true, err
			case errno == 0:
				return false, nil
			case errno == unix.ENOENT:
				return true, dumpErr
			}
			return true, fmt.Errorf("netlink: %w", errno)
		}
		if h.Flags&unix.NLM_F_DUMP_INTR != 0 {
			dumpErr = errDumpInterrupted
		}
		if dumpErr != nil || len(msg) < 4 {
			return false, nil
		}
		r, ok := parseNFTRule(msg[4:])
		if !ok {
			dumpErr = errMalformedRule
			return false, nil
		}
		// The kernel filters by table and chain since Linux 4.x; one
		// that does not would send every rule of the family.
		if string(r.table) == table && (chain == "" || string(r.chain) == chain) {
			fn(&r)
		}
		return false, nil
	})
}

var errMalformedRule = errors.New("netlink: malformed rule attributes")

// nftRuleRef names one rule for a deletion.
type nftRuleRef struct {
	family       byte
	table, chain string
	handle       uint64
}

// nftBatchMax bounds the bytes of one batch of deletions. A batch is one
// sendmsg, which netlink refuses beyond the socket's send buffer
// (net.core.wmem_default, 208 KiB on most hosts): a gc releasing a leaked
// /20's rules splits them.
const nftBatchMax = 64 << 10

// deleteRules deletes refs by handle, in as few batches as nftBatchMax
// allows. Each batch is one nftables transaction: a rule gone since it
// was listed (its plugin's DEL won) fails it whole, and nothing of it is
// deleted. Batches committed before a failed one stay committed; what the
// caller is told is the failure, and its next listing finds what is left.
func (c *probeConn) deleteRules(refs []nftRuleRef) error {
	for len(refs) > 0 {
		batch, n, first, last := c.deleteBatch(refs)
		if err := c.commit(batch, first, last); err != nil {
			return err
		}
		refs = refs[n:]
	}
	return nil
}

// deleteBatch builds one batch (BATCH_BEGIN, a DELRULE per rule, BATCH_END)
// of at most nftBatchMax bytes (at least one rule), and returns it, how
// many refs it holds, and the range of sequence numbers it uses.
func (c *probeConn) deleteBatch(refs []nftRuleRef) (batch []byte, n int, first, last uint32) {
	c.Seq++
	first = c.Seq
	batch = appendBatchMsg(batch, unix.NFNL_MSG_BATCH_BEGIN, c.Seq)
	for n < len(refs) && (n == 0 || len(batch) < nftBatchMax-256) {
		r := refs[n]
		c.Seq++
		start := len(batch)
		batch = append(batch, make([]byte, unix.NLMSG_HDRLEN)...)
		batch = append(batch, r.family, unix.NFNETLINK_V0, 0, 0) // nfgenmsg
		batch = nlmsg.AppendStringAttr(batch, unix.NFTA_RULE_TABLE, r.table)
		batch = nlmsg.AppendStringAttr(batch, unix.NFTA_RULE_CHAIN, r.chain)
		batch = binary.NativeEndian.AppendUint16(batch, unix.SizeofNlAttr+8)
		batch = binary.NativeEndian.AppendUint16(batch, unix.NFTA_RULE_HANDLE)
		batch = binary.BigEndian.AppendUint64(batch, r.handle)
		nlmsg.PutHeader(batch[start:], unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_DELRULE, unix.NLM_F_REQUEST, c.Seq)
		n++
	}
	c.Seq++
	batch = appendBatchMsg(batch, unix.NFNL_MSG_BATCH_END, c.Seq)
	return batch, n, first, c.Seq
}

// appendBatchMsg appends a batch delimiter for the nftables subsystem.
func appendBatchMsg(b []byte, typ uint16, seq uint32) []byte {
	start := len(b)
	b = append(b, make([]byte, unix.NLMSG_HDRLEN)...)
	// nfgenmsg: res_id is the subsystem, in network byte order.
	b = append(b, unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES)
	nlmsg.PutHeader(b[start:], typ, unix.NLM_F_REQUEST, seq)
	return b
}

// commit sends one batch and reads what the kernel says of it. Without
// NLM_F_ACK the kernel answers only a message that failed (or the batch
// header, when the transaction as a whole could not be committed), so
// silence is success; a request sent after the batch, whose answer comes
// after everything the batch caused, says when the silence is complete. A
// thousand acknowledgements would overflow the socket's receive buffer.
func (c *probeConn) commit(batch []byte, first, last uint32) error {
	if err := c.Send(batch); err != nil {
		return err
	}
	sentinel, err := c.sendGetGen()
	if err != nil {
		return err
	}
	var failed error
	err = c.Receive(func(h *unix.NlMsghdr, msg []byte) (bool, error) {
		switch {
		case h.Seq == sentinel:
			return true, nil
		case h.Seq < first || h.Seq > last || h.Type != unix.NLMSG_ERROR:
			return false, nil
		}
		errno, err := nlmsg.Errno(msg)
		if err != nil {
			return true, err
		}
		if errno != 0 && failed == nil {
			failed = fmt.Errorf("netlink: %w", errno)
		}
		return false, nil
	})
	if err != nil {
		return err
	}
	return failed
}

// sendGetGen asks for nftables' ruleset generation (NFT_MSG_GETGEN) and
// returns the request's sequence number.
func (c *probeConn) sendGetGen() (uint32, error) {
	c.Seq++
	req := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+4)
	req = append(req, unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0) // nfgenmsg
	nlmsg.PutHeader(req, unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETGEN, unix.NLM_F_REQUEST, c.Seq)
	return c.Seq, c.Send(req)
}
