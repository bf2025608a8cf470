package netfilter

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/nlmsg"
)

// A probe finds which containers own iptables NAT rules on a network
// without `iptables -S`: on a host whose iptables is iptables-nft, the
// rules are nftables rules, and the two chains a sweep reads (POSTROUTING,
// CNI-HOSTPORT-DNAT) are dumped over netlink in-process. `iptables -S`
// decodes the whole nat table in a process of its own: ≈ 50 ms with the
// rules of 1023 containers, where the dump of the two chains takes a few.
// A probe has only the owners, not the rulespecs a Delete needs: a sweep
// that finds an owner to release lists the rules again with iptables.

// ErrNoProbe says that this host's owners can only be told by listing.
var ErrNoProbe = errors.New("iptables is not iptables-nft: owners are listed with iptables -S")

// nftBinaries are the names iptables-nft's binaries resolve to (Debian's
// and Fedora's alternatives link iptables to iptables-nft, itself a link
// to xtables-nft-multi; Alpine links iptables there directly).
var nftBinaries = map[string]bool{
	"xtables-nft-multi": true,
	"iptables-nft":      true,
	"ip6tables-nft":     true,
}

// nftBacked reports whether the iptables binary at path is iptables-nft,
// from what its links resolve to: bridge and portmap run the same binary
// (go-iptables runs the first iptables in PATH), so its rules are where
// that binary keeps them. Anything else (iptables-legacy, a wrapper, a
// path that does not resolve) is not known to be: a probe would not see
// its rules.
func nftBacked(path string) bool {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return false
	}
	fi, err := os.Stat(real)
	if err != nil || !fi.Mode().IsRegular() {
		return false
	}
	return nftBinaries[filepath.Base(real)]
}

// RulesetID names the nftables ruleset a probe read: its network
// namespace (by cookie, which is never given twice within a boot), the
// generation nftables counts its commits by there, and the families
// probed. Two probes of one network with equal IDs in the same boot read
// the same rules, so they name the same owners.
type RulesetID struct {
	Cookie   uint64
	Gen      uint32
	Families string
}

// Probed is a probe's owners and the ruleset they were read from. ID is
// zero when that cannot be told, or the ruleset changed during the probe.
type Probed struct {
	ID     RulesetID
	Owners []string
	// Kept: the owners are what an earlier probe kept for ID.
	Kept bool
}

// ProbeSince lists the owners of network's iptables NAT rules in every
// family, as Snapshot(network).Containers() would, sorted; ErrNoProbe when
// the host's iptables binaries are not iptables-nft, or none is there to
// trust (tests' fake tables). When kept has owners for the ruleset as it
// is now (same namespace, no commit since), they are the answer, for one netlink round trip instead of a
// dump of the chains (most of a sweep of a full bridge's live
// attachments). kept may be nil.
func (c *Cleaner) ProbeSince(network string, kept func(RulesetID) ([]string, bool)) (Probed, error) {
	tables := c.Families()
	if len(tables) == 0 {
		return Probed{}, ErrNoProbe
	}
	var families []byte
	for _, t := range tables {
		nt, ok := t.(*natTable)
		if !ok || !nftBacked(nt.path) {
			return Probed{}, ErrNoProbe
		}
		families = append(families, nt.family())
	}
	conn, err := dialProbe()
	if err != nil {
		return Probed{}, fmt.Errorf("probe NAT rules: %w", err)
	}
	defer conn.Close()
	id := conn.rulesetID(families)
	if kept != nil && id != (RulesetID{}) {
		if owners, ok := kept(id); ok {
			return Probed{ID: id, Owners: owners, Kept: true}, nil
		}
	}
	owners, err := conn.owners(network, families)
	if err != nil {
		return Probed{}, err
	}
	// A commit during the dump changes the generation: nothing to keep.
	// (The kernel counts a commit's generation a moment before its rules
	// show; a dump inside that moment keeps the owners before it under
	// the new generation, found again at the next commit: at worst an
	// orphan goes one commit later.)
	if after := conn.rulesetID(families); after != id {
		id = RulesetID{}
	}
	return Probed{ID: id, Owners: owners}, nil
}

// owners dumps the chains a probe reads and names the owners of their
// rules on network, sorted.
func (c *probeConn) owners(network string, families []byte) ([]string, error) {
	seen := map[string]bool{}
	// Every comment ParseComment gives network for begins so: the others
	// are not parsed.
	prefix := fmt.Sprintf("name: %q id: ", network)
	for _, family := range families {
		for _, chain := range []string{postrouting, hostportDNAT} {
			err := c.eachRuleComment(family, natTableName, chain, func(comment []byte) {
				if !bytes.HasPrefix(bytes.TrimPrefix(comment, []byte("dnat ")), []byte(prefix)) {
					return
				}
				if net, cid, ok := ParseComment(string(comment)); ok && net == network {
					seen[cid] = true
				}
			})
			if err != nil {
				return nil, fmt.Errorf("probe NAT rules of %s: %w", chain, err)
			}
		}
	}
	out := make([]string, 0, len(seen))
	for cid := range seen {
		out = append(out, cid)
	}
	sort.Strings(out)
	return out, nil
}

// rulesetID is the ruleset's ID now; zero when the kernel cannot tell
// (no SO_NETNS_COOKIE before Linux 5.14, no generation).
func (c *probeConn) rulesetID(families []byte) RulesetID {
	cookie, err := unix.GetsockoptUint64(c.FD, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil || cookie == 0 {
		return RulesetID{}
	}
	gen, err := c.generation()
	if err != nil {
		return RulesetID{}
	}
	return RulesetID{Cookie: cookie, Gen: gen, Families: fmt.Sprint(families)}
}

// generation asks nftables for its ruleset generation (NFT_MSG_GETGEN),
// which every commit in this network namespace changes.
func (c *probeConn) generation() (uint32, error) {
	seq, err := c.sendGetGen()
	if err != nil {
		return 0, err
	}
	var gen uint32
	err = c.Receive(func(h *unix.NlMsghdr, msg []byte) (bool, error) {
		if h.Seq != seq {
			return false, nil
		}
		if h.Type == unix.NLMSG_ERROR {
			errno, err := nlmsg.Errno(msg)
			if err == nil && errno != 0 {
				err = fmt.Errorf("netlink: %w", errno)
			}
			return err != nil, err
		}
		if len(msg) < 4 {
			return true, errors.New("netlink: short generation message")
		}
		found := false
		nlmsg.EachAttr(msg[4:], func(typ uint16, data []byte) {
			if typ == unix.NFTA_GEN_ID && len(data) == 4 {
				gen, found = binary.BigEndian.Uint32(data), true
			}
		})
		if !found {
			return true, errors.New("netlink: no generation in the answer")
		}
		return true, nil
	})
	return gen, err
}

func (t *natTable) family() byte {
	if t.IsIPv6() {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// errDumpInterrupted: the ruleset changed during the dump, which is then
// not a consistent view (NLM_F_DUMP_INTR).
var errDumpInterrupted = errors.New("netlink dump interrupted by a ruleset change")

// probeConn is a netlink socket to nftables, read without allocating per
// message: a thousand rules are a few hundred kilobytes of attributes, and
// a decoder that builds them into values (google/nftables, mdlayher's
// AttributeDecoder) costs more than `iptables -S` saves.
type probeConn struct{ *nlmsg.Conn }

func dialProbe() (*probeConn, error) {
	c, err := nlmsg.Dial(unix.NETLINK_NETFILTER, 64<<10)
	if err != nil {
		return nil, err
	}
	return &probeConn{c}, nil
}

// eachRuleComment calls fn with the comment of every rule of chain in
// table (nftables family), where iptables-nft keeps `-m comment`: an xt
// "comment" match (iptables-nft up to now) or the rule's userdata comment
// (what newer versions may write instead). A table or chain that does not
// exist has no rules.
func (c *probeConn) eachRuleComment(family byte, table, chain string, fn func(comment []byte)) error {
	return c.eachRule(family, table, chain, func(r *nftRule) { r.comments(fn) })
}

// cString is an attribute's string without its terminating NUL.
func cString(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}

// udataTypeComment is libnftnl's NFTNL_UDATA_RULE_COMMENT: the TLV type
// of a rule's comment in its userdata, as nft and bridge write it.
const udataTypeComment = 0

// udataComment is the comment in a rule's userdata (libnftnl's TLVs: a
// type byte, a length byte, the value), without its NUL. Unlike
// userdata.Get, a length past the end is no comment, not a panic: anyone
// with CAP_NET_ADMIN writes userdata.
func udataComment(b []byte) ([]byte, bool) {
	for len(b) >= 2 {
		typ, l := b[0], int(b[1])
		if 2+l > len(b) {
			return nil, false
		}
		if typ == udataTypeComment {
			return cString(b[2 : 2+l]), true
		}
		b = b[2+l:]
	}
	return nil, false
}

// comments calls fn with the rule's userdata comment and the comment of
// each xt "comment" match among its expressions.
func (r *nftRule) comments(fn func([]byte)) {
	if c, ok := udataComment(r.userdata); ok {
		fn(c)
	}
	nlmsg.EachAttr(r.exprs, func(typ uint16, elem []byte) {
		if typ == unix.NFTA_LIST_ELEM {
			matchComment(elem, fn)
		}
	})
}

// matchComment reads an expression: an xt "comment" match's info is
// struct xt_comment_info, the comment NUL-terminated in 256 bytes.
func matchComment(elem []byte, fn func([]byte)) {
	name, data := namedAttr(elem, unix.NFTA_EXPR_NAME, unix.NFTA_EXPR_DATA)
	if name != "match" || data == nil {
		return
	}
	if match, info := namedAttr(data, unix.NFTA_MATCH_NAME, unix.NFTA_MATCH_INFO); match == "comment" && info != nil {
		fn(cString(info))
	}
}

// namedAttr finds, among b's attributes, the string of type nameType and
// the payload of type dataType: an expression's name and data, a match's
// name and info.
func namedAttr(b []byte, nameType, dataType uint16) (name string, data []byte) {
	nlmsg.EachAttr(b, func(typ uint16, v []byte) {
		switch typ {
		case nameType:
			name = string(cString(v))
		case dataType:
			data = v
		}
	})
	return name, data
}
