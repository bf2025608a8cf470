package netfilter

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// dialNFT opens one netlink socket for all of a caller's requests (without
// AsLasting, google/nftables opens one per request).
func dialNFT() (*nftables.Conn, error) {
	c, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("nftables netlink socket: %w", err)
	}
	return c, nil
}

// listRules lists the rules of chain in table, nftables family family. A
// table or chain that does not exist has no rules; nor has one this
// process may not list (EPERM: not root), none of whose rules it made.
func listRules(c *nftables.Conn, family nftables.TableFamily, table, chain string) ([]*nftables.Rule, error) {
	t := &nftables.Table{Family: family, Name: table}
	rules, err := c.GetRules(t, &nftables.Chain{Table: t, Name: chain})
	if isErrno(err, unix.ENOENT) || isErrno(err, unix.EPERM) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	// The kernel filters by table and chain since Linux 4.x; one that
	// does not would send every rule of the family.
	return slices.DeleteFunc(rules, func(r *nftables.Rule) bool {
		return r.Table == nil || r.Table.Name != table || r.Chain == nil || r.Chain.Name != chain
	}), nil
}

// isErrno reports whether err is errno. google/nftables v0.3.0 formats
// the receive error of GetRules and ListChain with %v, which drops the
// errno from the chain: its text, which mdlayher/netlink writes as
// "netlink receive: <errno>", is what is left of it.
func isErrno(err error, errno unix.Errno) bool {
	if err == nil {
		return false
	}
	return errors.Is(err, errno) || strings.HasSuffix(err.Error(), "netlink receive: "+errno.Error())
}

// nftBatchRules bounds the deletions of one batch, so that one batch stays
// under both socket buffers. google/nftables sends a batch in one sendmsg,
// which netlink refuses beyond the socket's send buffer
// (net.core.wmem_default, 208 KiB on most hosts: EMSGSIZE), and asks an
// acknowledgement of each deletion, each its own skb in the receive buffer
// (net.core.rmem_default, as much), where the kernel drops those that do
// not fit: Flush then fails with ENOBUFS although the batch committed. A
// deletion is at most 548 bytes (two names of at most 255 bytes), so 100
// are at most 54 KiB sent; measured on Linux 6.18 with the default
// buffers, one batch of 250 deletions was acknowledged, one of 300 failed
// with ENOBUFS, one of 600 (names of 200 bytes) with EMSGSIZE. A gc
// releasing a leaked /20's rules splits them.
const nftBatchRules = 100

// deleteRules deletes rules by handle (Conn.DelRule, what `nft delete
// rule ... handle N` sends), in batches of at most nftBatchRules. Each batch is one nftables transaction: a rule gone since
// it was listed (its plugin's DEL won) fails it whole (ENOENT), and
// nothing of it is deleted. Batches committed before a failed one stay
// committed; what the caller is told is the failure, and its next listing
// finds what is left.
func deleteRules(c *nftables.Conn, rules []*nftables.Rule) error {
	for batch := range slices.Chunk(rules, nftBatchRules) {
		for _, r := range batch {
			if err := c.DelRule(r); err != nil {
				return err
			}
		}
		if err := c.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// udataComment is the comment in a rule's userdata (libnftnl's TLVs: a
// type byte, a length byte, the value), without its NUL, as nft and
// bridge write it. Unlike userdata.Get, a length past the end is no
// comment, not a panic: anyone with CAP_NET_ADMIN writes userdata.
func udataComment(b []byte) ([]byte, bool) {
	for len(b) >= 2 {
		typ, l := b[0], int(b[1])
		if 2+l > len(b) {
			return nil, false
		}
		if userdata.Type(typ) == userdata.TypeComment {
			comment, _, _ := bytes.Cut(b[2:2+l], []byte{0})
			return comment, true
		}
		b = b[2+l:]
	}
	return nil, false
}
