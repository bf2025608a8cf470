package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Helpers for the reclaim tests: attachment records, boot facts,
// namespaces that die without a DEL, forged leases, running the plugin
// binary directly.

// recordDirName is the plugin's directory under dataDir (a name
// no CNI network can have, so host-local never collides with it).
const recordDirName = ".nomad-bridge-cni"

// attachRecord is the plugin's attachment record as written on disk.
type attachRecord struct {
	Version     int    `json:"version"`
	Network     string `json:"network"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Netns       string `json:"netns"`
	NetnsID     struct {
		Dev uint64 `json:"dev"`
		Ino uint64 `json:"ino"`
	} `json:"netnsID"`
	BootID   string    `json:"bootID"`
	Created  time.Time `json:"created"`
	State    string    `json:"state"`
	PID      int       `json:"pid"`
	PIDStart uint64    `json:"pidStart"`
	IPs      []string  `json:"ips"`
}

// recordDir is where the plugin keeps the test network's records.
func (e *testEnv) recordDir() string { return filepath.Join(e.dataDir, recordDirName, e.netName) }

// recordPath is the record of cid's eth0 attachment.
func (e *testEnv) recordPath(cid string) string {
	return filepath.Join(e.recordDir(), cid+"@"+ifName)
}

// readRecord reads cid's record; it fails the test when there is none.
func (e *testEnv) readRecord(t *testing.T, cid string) (attachRecord, []byte) {
	t.Helper()
	raw, err := os.ReadFile(e.recordPath(cid))
	if err != nil {
		t.Fatalf("record of %s: %v (records: %v)", cid, err, e.recordNames(t))
	}
	var r attachRecord
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatalf("record %s is not JSON: %v\n%s", e.recordPath(cid), err, raw)
	}
	return r, raw
}

// assertRecord checks that ns holds a complete record for addr, from this
// boot, naming the namespace that is at ns.path now, mode 0600.
func (e *testEnv) assertRecord(t *testing.T, ns netns, addr netip.Addr) attachRecord {
	t.Helper()
	r, raw := e.readRecord(t, ns.cid)
	fi, err := os.Stat(e.recordPath(ns.cid))
	if err != nil {
		t.Fatalf("stat record: %v", err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("record %s has mode %v, want 0600", e.recordPath(ns.cid), fi.Mode().Perm())
	}
	dev, ino := netnsIdentity(t, ns.path)
	switch {
	case r.Network != e.netName || r.ContainerID != ns.cid || r.IfName != ifName:
		t.Fatalf("record names %s %s/%s, want %s %s/%s: %s", r.Network, r.ContainerID, r.IfName, e.netName, ns.cid, ifName, raw)
	case r.State != "complete":
		t.Fatalf("record of a finished ADD is %q, want complete: %s", r.State, raw)
	case r.Netns != ns.path:
		t.Fatalf("record netns %q, want %q", r.Netns, ns.path)
	case r.NetnsID.Dev != dev || r.NetnsID.Ino != ino:
		t.Fatalf("record netnsID %+v, want dev %d ino %d (the namespace at %s now): %s", r.NetnsID, dev, ino, ns.path, raw)
	case r.BootID != bootID(t):
		t.Fatalf("record bootID %q, want this boot's %q", r.BootID, bootID(t))
	}
	if addr.IsValid() && !slices.ContainsFunc(r.IPs, func(s string) bool {
		p, err := netip.ParsePrefix(s)
		return err == nil && p.Addr() == addr
	}) {
		t.Fatalf("record IPs %v do not include %s", r.IPs, addr)
	}
	return r
}

// assertNoRecord checks that cid has no record.
func (e *testEnv) assertNoRecord(t *testing.T, cid string) {
	t.Helper()
	if _, err := os.Lstat(e.recordPath(cid)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("record of %s still exists (lstat: %v)", cid, err)
	}
}

// recordNames lists every file in the record directory (dot files, the
// migration marker and temp files, included).
func (e *testEnv) recordNames(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(e.recordDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatalf("read record dir: %v", err)
	}
	var names []string
	for _, ent := range entries {
		names = append(names, ent.Name())
	}
	return names
}

// recordMarkers are the plugin's per-network marker files next to the
// records: the legacy migration's, the not-tmpfs warning's and the last
// CHECK sweep's. They are not records; a temp file is.
var recordMarkers = []string{".migrated", ".warned-not-tmpfs", ".last-sweep"}

// assertRecordsExactly checks that the record directory holds records of
// exactly cids, besides the markers; a leftover temp file counts.
func (e *testEnv) assertRecordsExactly(t *testing.T, cids ...string) {
	t.Helper()
	var got []string
	for _, n := range e.recordNames(t) {
		if !slices.Contains(recordMarkers, n) {
			got = append(got, n)
		}
	}
	var want []string
	for _, c := range cids {
		want = append(want, c+"@"+ifName)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("record dir %s holds %q, want %q", e.recordDir(), got, want)
	}
}

// netnsIdentity is the device and inode of the namespace mounted at path.
func netnsIdentity(t *testing.T, path string) (dev, ino uint64) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	return st.Dev, st.Ino
}

// bootID is this boot's /proc/sys/kernel/random/boot_id.
func bootID(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatalf("boot id: %v", err)
	}
	return strings.TrimSpace(string(raw))
}

// bootTime is btime from /proc/stat.
func bootTime(t *testing.T) time.Time {
	t.Helper()
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatalf("read /proc/stat: %v", err)
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			sec, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatalf("btime %q: %v", v, err)
			}
			return time.Unix(sec, 0)
		}
	}
	t.Fatal("no btime in /proc/stat")
	return time.Time{}
}

// ---------------------------------------------------------------------------
// Configuration

// reclaimConf is confFor with the plugin entry's ipam.dataDir pointing at
// the test's own persistent directory: the plugin treats it as the legacy
// lease directory to migrate from, so no test ever reads or writes the real
// /var/lib/cni/networks.
func (e *testEnv) reclaimConf(t *testing.T, file string) map[string]any {
	t.Helper()
	conf := e.confFor(t, file)
	entryOfType(t, conf, pluginType)["ipam"].(map[string]any)["dataDir"] = e.persistDir
	return conf
}

// setRange limits the IPv4 range of the conflist's bridge entry (ours or
// bare bridge) to start..end.
func setRange(t *testing.T, conf map[string]any, start, end netip.Addr) {
	t.Helper()
	for _, p := range pluginEntries(t, conf) {
		if p["type"] != pluginType && p["type"] != "bridge" {
			continue
		}
		ipam := p["ipam"].(map[string]any)
		if _, ok := ipam["subnet"]; ok {
			ipam["rangeStart"], ipam["rangeEnd"] = start.String(), end.String()
			return
		}
		for _, set := range ipam["ranges"].([]any) {
			for _, r := range set.([]any) {
				rm := r.(map[string]any)
				if p, err := netip.ParsePrefix(rm["subnet"].(string)); err == nil && p.Addr().Is4() {
					rm["rangeStart"], rm["rangeEnd"] = start.String(), end.String()
					return
				}
			}
		}
	}
	t.Fatal("conflist has no IPv4 range to limit")
}

// hostAddr is the n-th address of the test's IPv4 subnet.
func (e *testEnv) hostAddr(n int) netip.Addr {
	a := e.subnet4.Addr().As4()
	a[3] += byte(n)
	return netip.AddrFrom4(a)
}

// entryConfig is the plugin entry of conf as a runtime hands it to the
// plugin: a single config carrying name and cniVersion.
func entryConfig(t *testing.T, conf map[string]any, typ string) []byte {
	t.Helper()
	entry := map[string]any{}
	for k, v := range entryOfType(t, conf, typ) {
		entry[k] = v
	}
	entry["name"] = conf["name"]
	entry["cniVersion"] = conf["cniVersion"]
	return mustJSON(t, entry)
}

// pluginCmd prepares the binary `plugin` of the bin dir as a runtime runs
// it: CNI_* environment, the config on stdin.
func (e *testEnv) pluginCmd(ctx context.Context, plugin, command, cid, netnsPath string, stdin []byte) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(e.bin, plugin))
	cmd.Env = cniEnv(
		"CNI_COMMAND="+command,
		"CNI_CONTAINERID="+cid,
		"CNI_NETNS="+netnsPath,
		"CNI_IFNAME="+ifName,
		"CNI_PATH="+e.bin,
	)
	cmd.Stdin = bytes.NewReader(stdin)
	return cmd
}

// runPlugin runs a plugin binary directly, without CNI_ARGS (see
// execPlugin), and returns stdout and stderr.
func (e *testEnv) runPlugin(plugin, command, cid, netnsPath string, stdin []byte) (string, string, error) {
	return e.execPlugin(plugin, command, cid, netnsPath, "", stdin)
}

// ---------------------------------------------------------------------------
// Namespaces that die without a DEL

// newNetns is addNetns for any goroutine: it returns an error instead of
// failing the test.
func (e *testEnv) newNetns(suffix string) (netns, error) {
	name := "nbc-e2e-" + e.id + "-" + suffix
	ns := netns{name: name, path: filepath.Join(netnsDir, name)}
	ns.cid = containerIDFor(ns.path)
	e.mu.Lock()
	if !slices.Contains(e.netnses, ns) {
		e.netnses = append(e.netnses, ns)
	}
	if !slices.Contains(e.cids, ns.cid) {
		e.cids = append(e.cids, ns.cid)
	}
	e.mu.Unlock()
	if err := run("ip", "netns", "add", name); err != nil {
		return ns, fmt.Errorf("create netns: %w", err)
	}
	return ns, nil
}

// killNetns deletes one namespace without any DEL, the way a crashed
// runtime or a lost namespace leaves a container. Unlike destroyNetns it
// only deletes that container's own host veth (found as the peer of its
// eth0), so the other containers on the bridge keep working; deleting it
// first makes the veth's end settled instead of asynchronous.
func (e *testEnv) killNetns(ns netns) error {
	if out, err := output("ip", "-j", "-n", ns.name, "link", "show", "dev", ifName); err == nil {
		var links []struct {
			LinkIndex int `json:"link_index"`
		}
		if err := json.Unmarshal([]byte(out), &links); err != nil {
			return fmt.Errorf("parse ip link in %s: %w", ns.name, err)
		}
		if len(links) == 1 && links[0].LinkIndex > 0 {
			host, err := output("ip", "-j", "link", "show")
			if err != nil {
				return err
			}
			var all []struct {
				Ifindex int    `json:"ifindex"`
				Ifname  string `json:"ifname"`
				Master  string `json:"master"`
			}
			if err := json.Unmarshal([]byte(host), &all); err != nil {
				return fmt.Errorf("parse ip link: %w", err)
			}
			for _, l := range all {
				if l.Ifindex == links[0].LinkIndex && l.Master == e.bridge {
					if err := run("ip", "link", "delete", l.Ifname); err != nil {
						return err
					}
				}
			}
		}
	}
	if err := run("ip", "netns", "delete", ns.name); err != nil {
		return err
	}
	if _, err := os.Stat(ns.path); !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("netns %s still present after delete (stat: %v)", ns.path, err)
	}
	return nil
}

func (e *testEnv) mustKillNetns(t *testing.T, ns netns) {
	t.Helper()
	if err := e.killNetns(ns); err != nil {
		t.Fatalf("kill netns %s: %v", ns.name, err)
	}
}

// ---------------------------------------------------------------------------
// Leases and rules

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

// masqJumps are the POSTROUTING jumps bridge commented for cid.
func (e *testEnv) masqJumps(t *testing.T, fam, cid string) []ipRule {
	t.Helper()
	var out []ipRule
	for _, r := range mustReadTable(t, fam, "nat").RulesIn("POSTROUTING") {
		if r.Comment() == e.masqComment(cid) {
			out = append(out, r)
		}
	}
	return out
}

// dnatJumps are portmap's CNI-HOSTPORT-DNAT jumps for cid.
func (e *testEnv) dnatJumps(t *testing.T, fam, cid string) []ipRule {
	t.Helper()
	var out []ipRule
	for _, r := range mustReadTable(t, fam, "nat").RulesIn(hostportDNATChain) {
		if r.Comment() == e.dnatComment(cid) {
			out = append(out, r)
		}
	}
	return out
}

// assertNoNAT checks that none of cid's bridge or portmap NAT state is
// left, in either family.
func (e *testEnv) assertNoNAT(t *testing.T, cid string) {
	t.Helper()
	ns := netns{cid: cid}
	e.assertNoMasq(t, ns)
	e.assertNoDNAT(t, ns)
}

// assertNetworkNATEmpty checks that the nat tables hold no rule commented
// with the test's network and no per-container chain of any container the
// test ever created.
func (e *testEnv) assertNetworkNATEmpty(t *testing.T) {
	t.Helper()
	owned := e.ownedChains()
	for _, fam := range ipFamilies {
		nat := mustReadTable(t, fam, "nat")
		for _, r := range nat.Rules {
			if strings.Contains(r.Comment(), fmt.Sprintf("name: %q", e.netName)) || slices.Contains(owned, r.Target()) {
				t.Errorf("%s: rule of the network left: %s", fam, r)
			}
		}
		for _, c := range owned {
			if nat.Chains[c] {
				t.Errorf("%s: chain %s left", fam, c)
			}
		}
	}
}
