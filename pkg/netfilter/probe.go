package netfilter

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// A probe finds which containers own iptables NAT rules on a network
// without `iptables -S`: on a host whose iptables is iptables-nft, the
// rules are nftables rules, and the two chains a sweep reads (POSTROUTING,
// CNI-HOSTPORT-DNAT) are dumped over netlink in-process. `iptables -S`
// decodes the whole nat table in a process of its own. Through
// google/nftables, which decodes every expression of every rule, the probe
// is not the cheaper one on a full bridge: with 1000 commented rules in
// POSTROUTING (2-core VM, medians), a probe took 31 ms, `iptables -S` and
// `ip6tables -S` 19 ms, the hand-written dump it replaced 6–7 ms. What a
// probe still saves is the listing of an unchanged ruleset (kept: one
// generation read, 0.2 ms).
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
	var families []nftables.TableFamily
	for _, t := range tables {
		nt, ok := t.(*natTable)
		if !ok || !nftBacked(nt.path) {
			return Probed{}, ErrNoProbe
		}
		families = append(families, nt.family())
	}
	gen, err := dialGen()
	if err != nil {
		return Probed{}, fmt.Errorf("probe NAT rules: %w", err)
	}
	defer gen.Close()
	conn, err := dialNFT()
	if err != nil {
		return Probed{}, fmt.Errorf("probe NAT rules: %w", err)
	}
	defer conn.CloseLasting()
	cookie := gen.cookie()
	before, err := gen.generation()
	if err != nil {
		return Probed{}, fmt.Errorf("probe NAT rules: %w", err)
	}
	id := rulesetID(cookie, before, families)
	if kept != nil && id != (RulesetID{}) {
		if owners, ok := kept(id); ok {
			return Probed{ID: id, Owners: owners, Kept: true}, nil
		}
	}
	// A commit during the dump changes the generation, and may have
	// changed the rules between the dump's messages: google/nftables does
	// not report a dump the kernel marked inconsistent (NLM_F_DUMP_INTR,
	// which the kernel sets from the same counter), so a dump is trusted
	// only under one generation from start to end; it is tried again once.
	// (The kernel counts a commit's generation a moment before its rules
	// show; a dump inside that moment keeps the owners before it under
	// the new generation, found again at the next commit: at worst an
	// orphan goes one commit later.)
	for try := 0; ; try++ {
		owners, err := natOwners(conn, network, families)
		if err != nil {
			return Probed{}, err
		}
		after, err := gen.generation()
		if err != nil {
			return Probed{}, fmt.Errorf("probe NAT rules: %w", err)
		}
		if after == before {
			return Probed{ID: id, Owners: owners}, nil
		}
		if try == 1 {
			return Probed{}, fmt.Errorf("probe NAT rules: %w", errDumpInterrupted)
		}
		before, id = after, rulesetID(cookie, after, families)
	}
}

// natOwners dumps the chains a probe reads and names the owners of their
// rules on network, sorted.
func natOwners(c *nftables.Conn, network string, families []nftables.TableFamily) ([]string, error) {
	seen := map[string]bool{}
	// Every comment ParseComment gives network for begins so: the others
	// are not parsed.
	prefix := fmt.Sprintf("name: %q id: ", network)
	for _, family := range families {
		for _, chain := range []string{postrouting, hostportDNAT} {
			rules, err := listRules(c, family, natTableName, chain)
			if err != nil {
				return nil, fmt.Errorf("probe NAT rules of %s: %w", chain, err)
			}
			for _, r := range rules {
				ruleComments(r, func(comment string) {
					if !strings.HasPrefix(strings.TrimPrefix(comment, "dnat "), prefix) {
						return
					}
					if net, cid, ok := ParseComment(comment); ok && net == network {
						seen[cid] = true
					}
				})
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

// rulesetID is the ruleset's ID; zero when the kernel cannot name the
// namespace (no SO_NETNS_COOKIE before Linux 5.14).
func rulesetID(cookie uint64, gen uint32, families []nftables.TableFamily) RulesetID {
	if cookie == 0 {
		return RulesetID{}
	}
	return RulesetID{Cookie: cookie, Gen: gen, Families: fmt.Sprint(families)}
}

func (t *natTable) family() nftables.TableFamily {
	if t.IsIPv6() {
		return nftables.TableFamilyIPv6
	}
	return nftables.TableFamilyIPv4
}

// errDumpInterrupted: the ruleset changed during the dump, which is then
// not a consistent view.
var errDumpInterrupted = errors.New("netlink dump interrupted by a ruleset change")

// genConn is a netlink socket that asks nftables for its ruleset
// generation (NFT_MSG_GETGEN), which every commit in this network
// namespace changes, and names that namespace (SO_NETNS_COOKIE):
// google/nftables v0.3.0 has no request for either (only its monitor
// decodes a generation) and does not hand out its socket.
type genConn struct{ *netlink.Conn }

func dialGen() (genConn, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return genConn{}, fmt.Errorf("nftables netlink socket: %w", err)
	}
	return genConn{c}, nil
}

// cookie is the socket's network namespace cookie; 0 when the kernel
// cannot tell.
func (c genConn) cookie() uint64 {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	var cookie uint64
	var optErr error
	if err := raw.Control(func(fd uintptr) {
		cookie, optErr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	}); err != nil || optErr != nil {
		return 0
	}
	return cookie
}

// generation is nftables' ruleset generation now.
func (c genConn) generation() (uint32, error) {
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0}, // nfgenmsg
	})
	if err != nil {
		return 0, fmt.Errorf("nftables generation: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, fmt.Errorf("nftables generation: %w", err)
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return ad.Uint32(), nil
			}
		}
	}
	return 0, errors.New("nftables generation: none in the answer")
}

// ruleComments calls fn with the comments of a rule of a chain where
// iptables-nft keeps `-m comment`: the rule's userdata comment (what newer
// versions may write) and the comment of each xt "comment" match among its
// expressions (iptables-nft up to now).
func ruleComments(r *nftables.Rule, fn func(string)) {
	if c, ok := udataComment(r.UserData); ok {
		fn(string(c))
	}
	for _, e := range r.Exprs {
		if m, ok := e.(*expr.Match); ok && m.Name == "comment" {
			if c, ok := matchComment(m.Info); ok {
				fn(c)
			}
		}
	}
}

// matchComment is the comment of an xt "comment" match's info, struct
// xt_comment_info: NUL-terminated in 256 bytes, which google/nftables
// decodes as xt.Comment (its NULs trimmed from the end only); info of
// another size it leaves as xt.Unknown.
func matchComment(info xt.InfoAny) (string, bool) {
	switch info := info.(type) {
	case *xt.Comment:
		return string(cString([]byte(*info))), true
	case *xt.Unknown:
		return string(cString(*info)), true
	}
	return "", false
}

// cString is a string without its terminating NUL and what follows.
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
