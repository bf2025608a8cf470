package e2e

import (
	"encoding/json"
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

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
func (e *testEnv) recordDir() string { return filepath.Join(e.stateDir, recordDirName, e.netName) }

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
// records: the legacy migration's, the not-tmpfs warning's, the last CHECK
// sweep's, the release counts, the ownership marker and the remembered
// addresses. They are not records; a
// temp file is.
var recordMarkers = []string{".migrated", ".warned-not-tmpfs", ".last-sweep", ".releases", ".owned", ".remembered", ".nat-checked"}

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
