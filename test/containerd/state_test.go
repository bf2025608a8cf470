package containerd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/utils"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/iptstate"
)

// leases reads host-local's lease files of the env's network: address ->
// the container ID host-local wrote first in the file.
func (e *env) leases(t *testing.T) map[netip.Addr]string {
	t.Helper()
	dir := filepath.Join(e.dataDir, e.net)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	out := map[netip.Addr]string{}
	for _, ent := range entries {
		a, err := netip.ParseAddr(ent.Name())
		if err != nil {
			continue // lock, last_reserved_ip.N
		}
		raw, err := os.ReadFile(filepath.Join(dir, ent.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[a], _, _ = strings.Cut(strings.TrimSpace(string(raw)), "\n")
		out[a] = strings.TrimSpace(out[a])
	}
	return out
}

// records lists the plugin's attachment records of the env's network
// (<container ID>@<ifname>).
func (e *env) records(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(e.dataDir, recordDirName, e.net))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ent := range entries {
		if !strings.HasPrefix(ent.Name(), ".") {
			out = append(out, ent.Name())
		}
	}
	return out
}

// natRules lists, per family, the nat table's rules that name the env's
// network in their comment (bridge's ipMasq: `name: "<net>" id: "<cid>"`),
// or whose chain is a pod's ipMasq chain; with cid set, only that pod's.
func (e *env) natRules(t *testing.T, cid string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, fam := range iptstate.Families {
		tb, err := iptstate.Read(fam, "nat")
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range tb.Rules {
			if e.ownsRule(r, cid) {
				out[fam] = append(out[fam], r.String())
			}
		}
	}
	return out
}

func (e *env) ownsRule(r iptstate.Rule, cid string) bool {
	want := fmt.Sprintf("name: %q", e.net)
	if cid != "" {
		want += fmt.Sprintf(" id: %q", cid)
		return strings.Contains(r.Comment(), want) || r.Chain == masqChain(e.net, cid)
	}
	return strings.Contains(r.Comment(), want) || slices.ContainsFunc(e.podIDs(), func(id string) bool { return r.Chain == masqChain(e.net, id) })
}

// masqChain is bridge's ipMasq chain of a container (plugins pkg/utils).
func masqChain(net, cid string) string { return utils.FormatChainName(net, cid) }

// masqChains lists, per family, the pods' ipMasq chains that exist.
func (e *env) masqChains(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, fam := range iptstate.Families {
		tb, err := iptstate.Read(fam, "nat")
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range e.podIDs() {
			if tb.Chains[masqChain(e.net, id)] {
				out[fam] = append(out[fam], masqChain(e.net, id))
			}
		}
	}
	return out
}

// netnsAddrs lists the global addresses on eth0 in the namespace at path.
func (e *env) netnsAddrs(t *testing.T, path string) []netip.Addr {
	t.Helper()
	out, err := e.run("nsenter", "--net="+path, "ip", "-j", "addr", "show", "dev", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	var links []struct {
		AddrInfo []struct {
			Local string `json:"local"`
			Scope string `json:"scope"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		t.Fatalf("parse ip addr: %v: %s", err, out)
	}
	var addrs []netip.Addr
	for _, l := range links {
		for _, a := range l.AddrInfo {
			if ip, err := netip.ParseAddr(a.Local); err == nil && a.Scope == "global" {
				addrs = append(addrs, ip)
			}
		}
	}
	return addrs
}

// assertAttached checks what a running pod must have: one lease per
// family, of the pod's addresses, naming the pod; the plugin's record; the
// ipMasq rules of both families naming the pod; the addresses on eth0 in
// its namespace.
func (e *env) assertAttached(t *testing.T, p *pod) {
	t.Helper()
	leases := e.leases(t)
	for _, a := range p.addrs {
		if leases[a] != p.id {
			t.Errorf("lease of %s: %q, want the pod %s (leases: %v)", a, leases[a], p.id, leases)
		}
	}
	if !e.bare && !slices.Contains(e.records(t), p.id+"@eth0") {
		t.Errorf("no record %s@eth0 of the pod (records: %v)", p.id, e.records(t))
	}
	rules := e.natRules(t, p.id)
	for _, fam := range iptstate.Families {
		if len(rules[fam]) == 0 {
			t.Errorf("%s: no nat rule names the pod %s", fam, p.id)
		}
	}
	if got := e.netnsAddrs(t, p.netns); !slices.Equal(sorted(got), sorted(p.addrs)) {
		t.Errorf("eth0 in %s has %v, want %v", p.netns, got, p.addrs)
	}
}

// assertNothingLeft checks that the network holds nothing: no lease, no
// record, no nat rule or ipMasq chain of any pod, no libcni cache entry.
func (e *env) assertNothingLeft(t *testing.T) {
	t.Helper()
	if l := e.leases(t); len(l) > 0 {
		t.Errorf("leases left: %v", l)
	}
	if r := e.records(t); len(r) > 0 {
		t.Errorf("records left: %v", r)
	}
	if r := e.natRules(t, ""); len(r) > 0 {
		t.Errorf("nat rules left: %v", r)
	}
	if c := e.masqChains(t); len(c) > 0 {
		t.Errorf("ipMasq chains left: %v", c)
	}
	if cached := e.cachedResults(); len(cached) > 0 {
		t.Errorf("libcni cache entries left: %v", cached)
	}
}

// cachedResults are go-cni's cached results of the env's network, and of
// the loopback network the CRI plugin sets up in each of its pods.
func (e *env) cachedResults() []string {
	cached, _ := filepath.Glob(filepath.Join(libcniCacheDir, e.net+"-*"))
	for _, id := range e.podIDs() {
		lo, _ := filepath.Glob(filepath.Join(libcniCacheDir, "cni-loopback-"+id+"-*"))
		cached = append(cached, lo...)
	}
	return cached
}

func (e *env) podIDs() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.pods)
}

func sorted(addrs []netip.Addr) []netip.Addr {
	out := slices.Clone(addrs)
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}
