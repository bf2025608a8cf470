package netfilter

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// RulesetState names the NAT ruleset a listing reads, where the host can
// tell: this network namespace (its cookie, never given twice within a
// boot) and nftables' generation there, which every commit changes
// (iptables-nft's and bridge's nftables alike). Two equal states within
// one boot are the same rules. Zero when it cannot be told: the host's
// iptables is not iptables-nft (an iptables-legacy commit changes no
// generation), or the kernel cannot name the namespace.
//
// A CHECK's sweep of a full bridge lists its 3000 iptables rules for
// orphans with `iptables -S` and `ip6tables -S`: 110 ms against 48 ms for a
// bare CHECK in one make bench run (bound: 1.5×). Reading the state is one
// netlink round trip; a sweep that finds it unchanged since a listing
// found no orphan skips that listing (reclaim's Request.SkipUnchangedNAT).
type RulesetState struct {
	Cookie uint64 `json:"cookie"`
	Gen    uint32 `json:"gen"`
}

// State reads the ruleset's state now (see RulesetState).
func (c *Cleaner) State() RulesetState {
	if c.StateFunc != nil {
		return c.StateFunc()
	}
	tables := c.families()
	if len(tables) == 0 {
		return RulesetState{}
	}
	for _, t := range tables {
		if nt, ok := t.(*natTable); !ok || !nftBacked(nt.path) {
			return RulesetState{}
		}
	}
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return RulesetState{}
	}
	defer conn.Close()
	cookie, gen, err := cookieAndGeneration(conn)
	if err != nil || cookie == 0 {
		return RulesetState{}
	}
	return RulesetState{Cookie: cookie, Gen: gen}
}

// cookieAndGeneration are the socket's network namespace cookie
// (SO_NETNS_COOKIE) and nftables' generation there (NFT_MSG_GETGEN):
// google/nftables v0.3.0 asks for neither.
func cookieAndGeneration(conn *netlink.Conn) (uint64, uint32, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var cookie uint64
	var optErr error
	if err := raw.Control(func(fd uintptr) {
		cookie, optErr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	}); err != nil || optErr != nil {
		return 0, 0, errors.Join(err, optErr)
	}
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0}, // nfgenmsg
	})
	if err != nil {
		return 0, 0, err
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, 0, err
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return cookie, ad.Uint32(), nil
			}
		}
	}
	return 0, 0, errors.New("nftables generation: none in the answer")
}

// nftBacked reports whether the iptables binary at path is iptables-nft,
// by what its links resolve to (Debian's and Fedora's alternatives, or
// Alpine's direct link): bridge and portmap run the first iptables in
// PATH too. Anything else (iptables-legacy, a wrapper) is not known to
// be: its commits may change no generation.
func nftBacked(path string) bool {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return false
	}
	fi, err := os.Stat(real)
	if err != nil || !fi.Mode().IsRegular() {
		return false
	}
	switch filepath.Base(real) {
	case "xtables-nft-multi", "iptables-nft", "ip6tables-nft":
		return true
	}
	return false
}
