package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ---------------------------------------------------------------------------
// Results

// cniResult is the part of a CNI result (any version) the tests look at.
type cniResult struct {
	CNIVersion string `json:"cniVersion"`
	Interfaces []struct {
		Name    string `json:"name"`
		Sandbox string `json:"sandbox"`
	} `json:"interfaces"`
	IPs []struct {
		Version   string `json:"version"`
		Interface *int   `json:"interface"`
		Address   string `json:"address"`
		Gateway   string `json:"gateway"`
	} `json:"ips"`
	// raw keeps the JSON as printed, to assert which keys exist.
	raw map[string]any
}

func parseResult(t *testing.T, stdout string) cniResult {
	t.Helper()
	var r cniResult
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("result is not JSON: %v\n%s", err, stdout)
	}
	if err := json.Unmarshal([]byte(stdout), &r.raw); err != nil {
		t.Fatalf("result is not a JSON object: %v\n%s", err, stdout)
	}
	return r
}

// addrIn returns the one address of the result inside p, and its gateway.
func (r cniResult) addrIn(t *testing.T, p netip.Prefix) (netip.Prefix, netip.Addr) {
	t.Helper()
	var found []netip.Prefix
	var gw netip.Addr
	for _, ip := range r.IPs {
		a, err := netip.ParsePrefix(ip.Address)
		if err != nil {
			t.Fatalf("result address %q: %v", ip.Address, err)
		}
		if !p.Contains(a.Addr()) {
			continue
		}
		found = append(found, a)
		if ip.Gateway != "" {
			if gw, err = netip.ParseAddr(ip.Gateway); err != nil {
				t.Fatalf("result gateway %q: %v", ip.Gateway, err)
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("want exactly one address in %s, result has %v (all: %+v)", p, found, r.IPs)
	}
	if found[0].Bits() != p.Bits() {
		t.Errorf("address %s: want prefix length %d of the subnet", found[0], p.Bits())
	}
	if !gw.IsValid() {
		t.Fatalf("address %s has no gateway in the result (isGateway is set)", found[0])
	}
	return found[0], gw
}

// ---------------------------------------------------------------------------
// Release lines on the plugin's stderr

// releaseLines are the plugin's "released" lines on stderr for the test's
// network.
func (e *testEnv) releaseLines(stderr string) []string {
	var out []string
	prefix := "nomad-bridge-cni: " + e.netName + ": released "
	for line := range strings.SplitSeq(stderr, "\n") {
		if strings.Contains(line, prefix) {
			out = append(out, line)
		}
	}
	return out
}

// assertReleased checks that stderr has exactly one release line for
// cid's eth0 attachment and that it contains every want string.
func (e *testEnv) assertReleased(t *testing.T, stderr, cid string, want ...string) {
	t.Helper()
	var mine []string
	for _, l := range e.releaseLines(stderr) {
		if strings.Contains(l, "released "+cid+"/") {
			mine = append(mine, l)
		}
	}
	if len(mine) != 1 {
		t.Errorf("want one release line for %s on stderr, got %q\nstderr: %s", cid, mine, stderr)
		return
	}
	for _, w := range want {
		if !strings.Contains(mine[0], w) {
			t.Errorf("release line %q does not mention %q", mine[0], w)
		}
	}
}

// ---------------------------------------------------------------------------
// Kernel state inside the namespace

// assertAddrOnIf checks that eth0 in ns (see netns.enter) carries addr.
func assertAddrOnIf(t *testing.T, ns netns, addr netip.Prefix) {
	t.Helper()
	enter := ns.enter()
	out, err := output(enter[0], append(enter[1:], "ip", "-j", "addr", "show", "dev", ifName)...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var links []struct {
		AddrInfo []struct {
			Local     string `json:"local"`
			Prefixlen int    `json:"prefixlen"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		t.Fatalf("parse ip addr: %v", err)
	}
	for _, l := range links {
		for _, a := range l.AddrInfo {
			if a.Local == addr.Addr().String() && a.Prefixlen == addr.Bits() {
				return
			}
		}
	}
	t.Fatalf("%s in %s does not carry %s: %s", ifName, ns.name, addr, out)
}

// assertLinkUp checks that a link inside the namespace is up.
func assertLinkUp(t *testing.T, ns netns, link string) {
	t.Helper()
	out, err := output("ip", "-j", "-n", ns.name, "link", "show", "dev", link)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var links []struct {
		Flags []string `json:"flags"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
		t.Fatalf("parse ip link: %v: %s", err, out)
	}
	if !slices.Contains(links[0].Flags, "UP") {
		t.Fatalf("%s in %s is not up: %s", link, ns.name, out)
	}
}

// waitAddrSettled waits until addr, an address of the host namespace (the
// bridge's IPv6 gateway), has finished duplicate address detection. bridge
// returns while the gateway address is still tentative, and a tentative
// address answers nothing, so an immediate ping6 would fail for ~1s. The
// subscription lists existing addresses after subscribing, so no change can
// slip between looking and listening.
func waitAddrSettled(t *testing.T, addr netip.Addr) {
	t.Helper()
	updates := make(chan netlink.AddrUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	subErr := make(chan error, 1)
	opts := netlink.AddrSubscribeOptions{
		ListExisting: true,
		ErrorCallback: func(err error) {
			select {
			case subErr <- err:
			default:
			}
		},
	}
	if err := netlink.AddrSubscribeWithOptions(updates, done, opts); err != nil {
		t.Fatalf("subscribe to address updates: %v", err)
	}
	timeout := time.After(15 * time.Second)
	for {
		select {
		case err := <-subErr:
			t.Fatalf("address subscription failed before %s settled: %v", addr, err)
		case u, ok := <-updates:
			if !ok {
				t.Fatalf("address subscription ended before %s settled", addr)
			}
			a, _ := netip.AddrFromSlice(u.LinkAddress.IP)
			if a.Unmap() != addr || !u.NewAddr {
				continue
			}
			switch {
			case u.Flags&unix.IFA_F_DADFAILED != 0:
				t.Fatalf("duplicate address detection failed for %s", addr)
			case u.Flags&unix.IFA_F_TENTATIVE == 0:
				return
			}
		case <-timeout:
			t.Fatalf("%s still tentative after 15s", addr)
		}
	}
}

// ping sends one echo request from inside the namespace (see netns.enter)
// to addr (the bridge
// gateway, an address the test created).
func ping(t *testing.T, ns netns, addr netip.Addr) {
	t.Helper()
	enter := ns.enter()
	if err := run(enter[0], append(enter[1:], "ping", "-c1", "-W2", addr.String())...); err != nil {
		t.Fatalf("ping %s from %s: %v", addr, ns.name, err)
	}
}

// assertReaches connects from the host to dial and must reach a listener
// on port mappedPort inside ns: directly on the container's address, or
// through portmap's DNAT of a host port.
func (e *testEnv) assertReaches(t *testing.T, ns netns, dial netip.AddrPort) {
	t.Helper()
	token := fmt.Sprintf("nbc-e2e-%s-%s", e.id, dial)
	listener := e.startListener(t, ns, mappedPort, token)
	conn, err := net.DialTimeout("tcp", dial.String(), 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", dial, err)
	}
	if err := conn.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatalf("set deadline: %v", err)
	}
	got, err := io.ReadAll(conn)
	conn.Close()
	if err != nil || string(got) != token {
		t.Fatalf("%s answered %q (%v), want %q from the container", dial, got, err, token)
	}
	if err := listener.Wait(); err != nil {
		t.Fatalf("listener: %v", err)
	}
}

// assertNetworkEmpty checks that nothing of the test network is left: no
// lease in leaseDir, no record, no NAT rule or chain.
func (e *testEnv) assertNetworkEmpty(t *testing.T, leaseDir string) {
	t.Helper()
	assertLeases(t, leaseDir, nil)
	e.assertRecordsExactly(t)
	e.assertNetworkNATEmpty(t)
}

// ---------------------------------------------------------------------------
// Leases

// leaseDir is host-local's directory for the test's network under the
// plugin's dataDir.
func (e *testEnv) leaseDir() string { return filepath.Join(e.stateDir, e.netName) }

// readLeases returns host-local's leases in dir: files whose names parse as
// IP addresses, mapped to their content. Other files (lock,
// last_reserved_ip.N) are host-local's bookkeeping. A missing dir is empty.
func readLeases(t *testing.T, dir string) map[netip.Addr]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return map[netip.Addr]string{}
	}
	if err != nil {
		t.Fatalf("read lease dir: %v", err)
	}
	leases := map[netip.Addr]string{}
	for _, ent := range entries {
		a, err := netip.ParseAddr(ent.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(dir, ent.Name()))
		if err != nil {
			t.Fatalf("read lease: %v", err)
		}
		leases[a] = string(raw)
	}
	return leases
}

// assertLease checks host-local's lease file for addr: it exists and holds
// "containerID\r\nifname".
func assertLease(t *testing.T, dir string, addr netip.Addr, cid string) {
	t.Helper()
	leases := readLeases(t, dir)
	got, ok := leases[addr]
	if !ok {
		t.Fatalf("no lease for %s in %s (leases: %v)", addr, dir, leases)
	}
	if want := cid + "\r\n" + ifName; got != want {
		t.Fatalf("lease %s/%s holds %q, want %q", dir, addr, got, want)
	}
}

// assertNoLeaseOf checks that cid holds no lease in the test's lease
// directory.
func (e *testEnv) assertNoLeaseOf(t *testing.T, cid string) {
	t.Helper()
	for addr, content := range readLeases(t, e.leaseDir()) {
		if strings.Contains(content, cid) {
			t.Errorf("lease %s of %s left: %q", addr, cid, content)
		}
	}
}

// assertLeases checks that dir holds exactly the given leases.
func assertLeases(t *testing.T, dir string, want map[netip.Addr]string) {
	t.Helper()
	got := readLeases(t, dir)
	if len(got) != len(want) {
		t.Fatalf("leases in %s: got %q, want %q", dir, got, want)
	}
	for a, w := range want {
		if got[a] != w {
			t.Fatalf("leases in %s: got %q, want %q", dir, got, want)
		}
	}
}

func leaseContent(cid string) string { return cid + "\r\n" + ifName }

// assertDefaultDirsUntouched checks that the plugin wrote no lease where
// host-local or the plugin would by default: only the tmpfs may hold them.
func (e *testEnv) assertDefaultDirsUntouched(t *testing.T) {
	t.Helper()
	for _, d := range []string{hostLocalDefaultDir, pluginDefaultDataDir} {
		p := filepath.Join(d, e.netName)
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s exists (stat: %v): leases must only go to the test's dataDir %s", p, err, e.dataDir)
		}
	}
}

// writeLease forges a host-local lease file and sets its mtime with
// `touch -d`, as an operator (or a reboot) would leave it.
func writeLease(t *testing.T, dir string, addr netip.Addr, content string, mtime time.Time) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("mkdir %s: %v", dir, err)
	}
	p := filepath.Join(dir, addr.String())
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatalf("write lease: %v", err)
	}
	if err := run("touch", "-d", fmt.Sprintf("@%d", mtime.Unix()), p); err != nil {
		t.Fatalf("touch lease: %v", err)
	}
	return p
}

// leaseMtime is the mtime of dir/addr.
func leaseMtime(t *testing.T, dir string, addr netip.Addr) time.Time {
	t.Helper()
	fi, err := os.Stat(filepath.Join(dir, addr.String()))
	if err != nil {
		t.Fatalf("stat lease: %v", err)
	}
	return fi.ModTime()
}
