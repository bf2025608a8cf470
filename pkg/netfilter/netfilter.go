// Package netfilter removes the NAT rules that bridge (ipMasq) and portmap
// leave for a container when nobody runs their DEL: the container's netns
// vanished (bridge then skips its teardown) or the runtime forgot it.
//
// Rules are found by the names and comments those plugins give them, never
// by address: bridge's POSTROUTING jump is commented
// utils.FormatComment(network, containerID) and jumps to the chain
// utils.FormatChainName(network, containerID); portmap's per-container chain
// is utils.MustFormatChainNameWithPrefix(network, containerID, "DN-"),
// jumped to from CNI-HOSTPORT-DNAT with the comment
// `dnat name: "<network>" id: "<containerID>"` (utils is plugins/pkg/utils;
// names.go builds the same names). bridge's nftables ipMasq rules are found
// by their comment too (ipmasq_nftables.go).
package netfilter

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coreos/go-iptables/iptables"
	"github.com/mattn/go-shellwords"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/crashpoint"
)

const (
	natTableName    = "nat"
	postrouting     = "POSTROUTING"
	hostportDNAT    = "CNI-HOSTPORT-DNAT"
	portmapDNPrefix = "DN-"
)

// Table is one iptables family as the cleaner uses it, so tests can run
// it against a fake. A chain that does not exist is an error isNotExist
// reports.
type Table interface {
	// List is `iptables -t <table> -S`: "-N chain" and "-A chain spec"
	// lines.
	List(table string) ([]string, error)
	Delete(table, chain string, rulespec ...string) error
	// FlushChain empties chain; DeleteChain deletes it, empty and
	// unreferenced; ClearAndDeleteChain does both at once (no kill leaves
	// it emptied).
	FlushChain(table, chain string) error
	DeleteChain(table, chain string) error
	ClearAndDeleteChain(table, chain string) error
}

// Cleaner releases the NAT rules of stale containers.
type Cleaner struct {
	// Tables are the iptables families present on the host (IPv4, IPv6).
	// Use families, which finds them on first use.
	Tables []Table
	// StateFunc, if set, stands for State (tests' fake tables).
	StateFunc func() RulesetState
	// findTables finds Tables lazily, so the ADD path pays nothing.
	findTables func() []Table
	// NFTables is bridge's nftables ipMasq backend; nil leaves nftables
	// alone.
	NFTables Backend
	// PortmapNFT releases portmap's nftables rules of released
	// attachments (ListPortmapNFT); false leaves them alone.
	PortmapNFT bool
	// Running, if set, names which of the container IDs a CNI command
	// runs for (sysinfo.Host.CNIProcesses): a sweep's release leaves
	// their portmap chains to them (see iptablesRules.Release).
	Running func(containerIDs []string) (map[string]int, error)
}

// New returns a Cleaner for every iptables family present on this host and
// for bridge's and portmap's nftables rules. A missing iptables binary is
// not an error: the host then only has nftables rules, if any.
func New() *Cleaner {
	return &Cleaner{NFTables: nftBackend{}, findTables: hostTables, PortmapNFT: true}
}

// kernelIPv6 is there while the kernel runs IPv6. One booted with
// ipv6.disable=1 holds no IPv6 rule, and ip6tables-legacy fails every
// listing there ("can't initialize ip6tables table `nat': Address family
// not supported by protocol", exit status 3): asked, it would fail every
// DEL and sweep.
var kernelIPv6 = "/proc/net/if_inet6"

// hostTables finds iptables and ip6tables in PATH without running them;
// ip6tables only while the kernel runs IPv6.
func hostTables() []Table {
	var tables []Table
	for _, f := range []struct {
		cmd   string
		proto iptables.Protocol
	}{{"iptables", iptables.ProtocolIPv4}, {"ip6tables", iptables.ProtocolIPv6}} {
		if _, err := os.Stat(kernelIPv6); err != nil && f.proto == iptables.ProtocolIPv6 {
			continue
		}
		if path, err := exec.LookPath(f.cmd); err == nil {
			tables = append(tables, &natTable{path: path, proto: f.proto})
		}
	}
	return tables
}

// noKernelTable is what iptables-legacy says of a table the kernel has
// not got ("can't initialize iptables table `nat': Table does not exist
// (do you need to insmod?)", exit status 3; libiptc's words for ENOENT):
// a kernel built without the legacy xtables tables (optional since Linux
// 6.17), or without that one, where iptables still runs iptables-legacy.
// Nothing can have put a rule there: bridge and portmap find that family
// unusable (utils.SupportsIPTables, portmap's maybeGetIptables) and skip
// it, and their DELs succeed; taken for a failure, it failed every DEL
// and sweep.
const noKernelTable = "Table does not exist (do you need to insmod?)"

// iptablesWait bounds iptables' wait for the xtables lock (iptables-legacy
// takes it; iptables-nft has none): a stuck holder must not hang a DEL,
// nor a sweep that holds host-local's lock. Tests make it shorter.
var iptablesWait = 30 * time.Second

// waitSeconds is iptablesWait as `-w` takes it.
func waitSeconds() string { return strconv.Itoa(int(iptablesWait / time.Second)) }

// natTable lists with one `iptables -w -t nat -S` and deletes through
// go-iptables, whose handle (it runs `iptables --version` and probes
// features) is only made when there is something to delete.
type natTable struct {
	path  string
	proto iptables.Protocol
	ipt   *iptables.IPTables
}

// List lists the whole table, its error with what iptables said: a
// caller wanting one chain picks its lines, as `-S <chain>` of a chain
// that does not exist fails (iptables-nft 1.8.9 even calls it
// "incompatible"). A table the kernel does not have holds no rule: it
// is listed empty (see noKernelTable).
func (t *natTable) List(table string) ([]string, error) {
	out, err := exec.Command(t.path, "-w", waitSeconds(), "-t", table, "-S").Output()
	if err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			if bytes.Contains(exitErr.Stderr, []byte(noKernelTable)) {
				return nil, nil
			}
			err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(exitErr.Stderr))
		}
		return nil, fmt.Errorf("%s -t %s -S: %w", t.path, table, err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n"), nil
}

// withHandle runs fn on go-iptables' handle, made on first use.
func (t *natTable) withHandle(step string, fn func(*iptables.IPTables) error) error {
	crashpoint.Step(step)
	if t.ipt == nil {
		ipt, err := iptables.New(iptables.IPFamily(t.proto), iptables.Timeout(int(iptablesWait/time.Second)))
		if err != nil {
			return err
		}
		t.ipt = ipt
	}
	return fn(t.ipt)
}

func (t *natTable) Delete(table, chain string, rulespec ...string) error {
	return t.withHandle("iptables delete rule in "+chain, func(ipt *iptables.IPTables) error {
		return ipt.Delete(table, chain, rulespec...)
	})
}

func (t *natTable) DeleteChain(table, chain string) error {
	return t.withHandle("iptables delete chain "+chain, func(ipt *iptables.IPTables) error {
		return ipt.DeleteChain(table, chain)
	})
}

// ClearAndDeleteChain empties and deletes chain in one iptables-restore
// transaction. go-iptables' runs iptables twice, -F then -X: killed between
// the two, it left an empty chain whose jump had gone already, which named
// nobody to the next sweep. A chain gone when the transaction fails (a
// concurrent DEL won) is ErrNoChain.
func (t *natTable) ClearAndDeleteChain(table, chain string) error {
	crashpoint.Step("iptables delete chain " + chain)
	restore, err := exec.LookPath(filepath.Base(t.path) + "-restore")
	if err != nil {
		return err
	}
	cmd := exec.Command(restore, "-w", waitSeconds(), "--noflush")
	cmd.Stdin = strings.NewReader(fmt.Sprintf("*%s\n-F %s\n-X %s\nCOMMIT\n", table, chain, chain))
	out, err := cmd.CombinedOutput()
	if err == nil {
		return nil
	}
	if lines, lerr := t.List(table); lerr == nil && !slices.Contains(lines, "-N "+chain) {
		return ErrNoChain
	}
	return fmt.Errorf("%s: flush and delete %s: %w: %s", restore, chain, err, bytes.TrimSpace(out))
}

// FlushChain runs `iptables -t table -F chain` itself: go-iptables'
// ClearChain creates a chain that is not there, which must stay gone.
func (t *natTable) FlushChain(table, chain string) error {
	crashpoint.Step("iptables flush chain " + chain)
	out, err := exec.Command(t.path, "-w", waitSeconds(), "-t", table, "-F", chain).CombinedOutput()
	if err != nil {
		msg := string(bytes.TrimSpace(out))
		if strings.Contains(msg, "No chain/target/match by that name") || strings.Contains(msg, "No such file or directory") || strings.Contains(msg, "does not exist") {
			err = ErrNoChain
		}
		return fmt.Errorf("%s -t %s -F %s: %w: %s", t.path, table, chain, err, msg)
	}
	return nil
}

// families returns the iptables families, finding them on first use.
func (c *Cleaner) families() []Table {
	if c.findTables != nil {
		c.Tables, c.findTables = c.findTables(), nil
	}
	return c.Tables
}

// rule is a listed jump: its chain and the rulespec Delete takes.
type rule struct {
	chain string
	spec  []string
}

// iptablesRules are one network's NAT rules in every iptables family.
type iptablesRules struct {
	network  string
	families []familyRules
	// running is Cleaner.Running; nil in a DEL's and a re-ADD's
	// release, which are that command.
	running func(containerIDs []string) (map[string]int, error)
}

type familyRules struct {
	table  Table
	chains map[string]bool
	// jumps maps a container ID to the rules that jump to its chains.
	jumps map[string][]rule
	// cut are the CNI-HOSTPORT-DNAT jumps whose comment names no
	// container of the network, by the chain they jump to: portmap's own
	// comment, cut short when a network name and container ID are over 235
	// characters together (trimComment, then iptables' 255), names its
	// container only by that chain (a hash of network and container ID).
	cut map[string][]rule
	// masq are the containers whose bridge chain holds rules commented
	// as its jump is: they name the container once the jump is gone (a
	// release killed between the jump and the chain).
	masq map[string]bool
}

// listNAT lists network's NAT rules: one `iptables -S` of the nat table
// per family, whatever the number of containers.
func (c *Cleaner) listNAT(network string) (*iptablesRules, error) {
	r := &iptablesRules{network: network, running: c.Running}
	// One family after the other: listing them at once saved the shorter
	// listing's time (ip6tables -S of a small table, 1.9 ms), which no
	// bound needs.
	for _, t := range c.families() {
		lines, err := t.List(natTableName)
		if err != nil {
			return nil, fmt.Errorf("list nat rules: %w", err)
		}
		fr := familyRules{table: t, chains: map[string]bool{}, jumps: map[string][]rule{}, cut: map[string][]rule{}, masq: map[string]bool{}}
		for _, line := range lines {
			if chain, ok := strings.CutPrefix(line, "-N "); ok {
				fr.chains[strings.TrimSpace(chain)] = true
				continue
			}
			chain, spec, ok := parseRule(line)
			comment, commented := ruleComment(spec)
			if !ok || !commented {
				continue
			}
			net, cid, named := ParseComment(comment)
			named = named && net == network
			target := slices.Index(spec, "-j") + 1
			switch {
			case chain != postrouting && chain != hostportDNAT:
				if named && chain == chainName(network, cid) {
					fr.masq[cid] = true
				}
			case named:
				fr.jumps[cid] = append(fr.jumps[cid], rule{chain: chain, spec: spec})
			case chain == hostportDNAT && target > 0 && target < len(spec):
				fr.cut[spec[target]] = append(fr.cut[spec[target]], rule{chain: chain, spec: spec})
			}
		}
		r.families = append(r.families, fr)
	}
	return r, nil
}

// Owners are the containers with a commented jump on the network, or a
// bridge chain whose own rules name them, sorted. Other chains without a
// jump (portmap's, whose rules carry no comment, or an emptied one) are
// only found for IDs the caller already knows (see Owned).
func (r *iptablesRules) Owners() []RuleOwner {
	var cids []string
	for _, fr := range r.families {
		cids = slices.AppendSeq(cids, maps.Keys(fr.jumps))
		cids = slices.AppendSeq(cids, maps.Keys(fr.masq))
	}
	slices.Sort(cids)
	var out []RuleOwner
	for _, cid := range slices.Compact(cids) {
		out = append(out, RuleOwner{Owner: cid, ContainerID: cid})
	}
	return out
}

// Owned lists the chains and jumps a container holds on the network.
func (r *iptablesRules) Owned(containerID string) []string {
	var out []string
	dn := r.portmapChain(containerID)
	for _, fr := range r.families {
		for _, j := range slices.Concat(fr.jumps[containerID], fr.cut[dn]) {
			out = append(out, "jump in "+j.chain)
		}
		for _, ch := range []string{chainName(r.network, containerID), dn} {
			if fr.chains[ch] {
				out = append(out, "chain "+ch)
			}
		}
	}
	return out
}

func (r *iptablesRules) portmapChain(containerID string) string {
	return chainNameWithPrefix(r.network, containerID, portmapDNPrefix)
}

// parseRule is the chain of an `iptables -S` line of a rule ("-A chain
// spec") and the rulespec Delete takes.
func parseRule(line string) (chain string, spec []string, ok bool) {
	words, err := shellwords.Parse(line)
	if err != nil || len(words) < 3 || words[0] != "-A" {
		return "", nil, false
	}
	return words[1], words[2:], true
}

// ruleComment is the value of a rulespec's --comment.
func ruleComment(spec []string) (string, bool) {
	i := slices.Index(spec, "--comment")
	if i < 0 || i+1 >= len(spec) {
		return "", false
	}
	return spec[i+1], true
}

// ParseComment extracts the network and container ID from a bridge or
// portmap rule comment: bridge's `name: "<net>" id: "<cid>"` and portmap's
// `dnat name: "<net>" id: "<cid>"`, the values Go-quoted
// (utils.FormatComment uses %q). A sweep parses one per rule of a
// thousand containers, so it is cut by hand, not by a regexp.
func ParseComment(comment string) (network, containerID string, ok bool) {
	rest, ok := strings.CutPrefix(strings.TrimPrefix(comment, "dnat "), "name: ")
	quotedNet, err := strconv.QuotedPrefix(rest)
	if !ok || err != nil {
		return "", "", false
	}
	quotedID, ok := strings.CutPrefix(rest[len(quotedNet):], " id: ")
	network, netErr := strconv.Unquote(quotedNet)
	containerID, idErr := strconv.Unquote(quotedID)
	if !ok || netErr != nil || idErr != nil || network == "" || containerID == "" {
		return "", "", false
	}
	// Only what bridge or portmap would have written: a comment that does
	// not round-trip (raw control characters, other quotes, say) is
	// someone else's.
	if formatted := formatComment(network, containerID); comment != formatted && comment != "dnat "+formatted {
		return "", "", false
	}
	return network, containerID, true
}

// ErrNoChain is a Table's error for a chain that is not there.
var ErrNoChain = errors.New("no such chain")

func isNotExist(err error) bool {
	var e *iptables.Error
	return errors.Is(err, ErrNoChain) || errors.As(err, &e) && e.IsNotExist()
}
