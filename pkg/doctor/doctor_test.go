package doctor

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/conflists"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/operator"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/dirstate"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/fakehost"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/fakenat"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var boot = time.Unix(1764576000, 0)

// plenty is a data dir's room that no check minds.
var plenty = Room{Bytes: 1 << 30, Inodes: 1 << 20}

// host is a fake host: configuration and bin directories, a data
// directory, the versions plugins print, and a sweeper on a fixed boot.
type host struct {
	t                     *testing.T
	root, conf, bin, data string
	versions              map[string]string
	tmpfs                 bool
	nomad                 bool
	nomadVersion          string // the agent's ("" unknown)
	// front are bin dirs before bin in the CNI path; euid the doctor's user.
	front []string
	euid  int
	// room is the data dir's free space (nil: plenty).
	room *Room
	// nat is the host's nat table (nil: no NAT rules are read).
	nat *fakenat.Table
}

func newHost(t *testing.T) *host {
	t.Helper()
	root := t.TempDir()
	h := &host{t: t, root: root, conf: filepath.Join(root, "net.d"), bin: filepath.Join(root, "bin"), data: filepath.Join(root, "run-cni"), tmpfs: true,
		versions: map[string]string{}}
	for _, d := range []string{h.conf, h.bin, h.data} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"loopback", "bridge", "host-local", "firewall", "portmap", pluginName} {
		h.plugin(p, "CNI "+p+" plugin v1.10.0\nCNI protocol versions supported: 0.1.0, 0.2.0, 1.1.0\n")
	}
	return h
}

func (h *host) plugin(name, prints string) {
	h.t.Helper()
	if err := os.WriteFile(filepath.Join(h.bin, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
		h.t.Fatal(err)
	}
	h.versions[name] = prints
}

func (h *host) conflist(file, body string) {
	h.t.Helper()
	body = strings.ReplaceAll(body, "DATA", h.data)
	if err := os.WriteFile(filepath.Join(h.conf, file), []byte(body), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

const chain = `{"cniVersion": "0.4.0", "name": "NAME", "plugins": [
  {"type": "loopback"},
  {"type": "TYPE", "bridge": "BRIDGE", "dataDir": "DATA", "ipMasq": true, "isGateway": true,
   "ipam": {"type": "IPAM", "ranges": [[{"subnet": "SUBNET"}]]}},
  {"type": "firewall", "backend": "iptables"},
  {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}]}`

func conf(name, typ, bridge, subnet, ipam string) string {
	return strings.NewReplacer("NAME", name, "TYPE", typ, "BRIDGE", bridge, "SUBNET", subnet, "IPAM", ipam).Replace(chain)
}

// frontCopy installs a copy of the plugin as bridge in dir, in front of
// the host's reference bridge, printing with no arguments what such a copy
// prints; it returns its path.
func (h *host) frontCopy(dir string) string {
	h.t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		h.t.Fatal(err)
	}
	path := filepath.Join(dir, "bridge")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755); err != nil {
		h.t.Fatal(err)
	}
	h.versions[path] = "CNI bridge plugin v1.10.0\nCNI nomad-bridge-cni plugin v0.1.0, in front of " + filepath.Join(h.bin, "bridge") + "\n"
	return path
}

// version is what the plugin at path prints with no arguments: the
// version set for its path, else for its file name.
func (h *host) version(path string) (string, error) {
	if v, ok := h.versions[path]; ok {
		return v, nil
	}
	return h.versions[filepath.Base(path)], nil
}

func (h *host) run() *Report {
	sw := &reclaim.Sweeper{Env: reclaim.Env{Host: fakehost.New(boot)}}
	if h.nat != nil {
		sw.Netfilter = &netfilter.Cleaner{Tables: []netfilter.Table{h.nat}}
	}
	path := append(slices.Clone(h.front), h.bin)
	return Run(Options{
		ConfDirs:     []string{h.conf, filepath.Join(h.root, "absent")},
		CNIPath:      path,
		CNIPathGiven: true,
		Nomad:        h.nomad,
		NomadClient: func() NomadClient {
			nc := NomadDefaults()
			nc.Source, nc.CNIPath, nc.CNIConfigDir, nc.Version = "the test's client", path, h.conf, h.nomadVersion
			return nc
		},
		EUID:    h.euid,
		Version: h.version,
		OnTmpfs: func(string) (bool, error) { return h.tmpfs, nil },
		Free: func(string) (Room, error) {
			if h.room != nil {
				return *h.room, nil
			}
			return plenty, nil
		},
		Sweeper: sw,
	})
}

func (h *host) golden(name string, r *Report) {
	h.t.Helper()
	var text, js bytes.Buffer
	if err := WriteText(&text, r); err != nil {
		h.t.Fatal(err)
	}
	if err := operator.WriteJSON(&js, r); err != nil {
		h.t.Fatal(err)
	}
	for file, got := range map[string][]byte{name + ".txt": text.Bytes(), name + ".json": js.Bytes()} {
		got = bytes.ReplaceAll(got, []byte(h.root), []byte("ROOT"))
		path := filepath.Join("testdata", file)
		if *update {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				h.t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			h.t.Fatalf("%v (run go test ./pkg/doctor -update)", err)
		}
		if !bytes.Equal(got, want) {
			h.t.Errorf("%s differs from the golden file:\n--- got\n%s\n--- want\n%s", file, got, want)
		}
	}
}

func TestCleanHost(t *testing.T) {
	h := newHost(t)
	h.conflist("10-web.conflist", conf("web", pluginName, "nbc0", "172.26.80.0/20", "host-local"))
	h.conflist("20-db.conflist", conf("db", "bridge", "db0", "10.77.0.0/24", "host-local"))
	h.nomad = true
	r := h.run()
	if !r.OK {
		t.Errorf("a clean host is not OK: %+v", r.Findings)
	}
	for _, f := range r.Findings {
		if f.Level != OK {
			t.Errorf("finding on a clean host: %+v", f)
		}
	}
	h.golden("clean", r)
}

// Each problem the doctor looks for, on one host.
func TestHostWithProblems(t *testing.T) {
	h := newHost(t)
	// A broken entry, a bridge and a subnet shared with another network,
	// Nomad's built-in range reused, an unstamped bridge, a missing
	// portmap, a dataDir not on tmpfs, a stale attachment and legacy
	// leases waiting.
	legacy := filepath.Join(h.root, "legacy")
	h.conflist("10-web.conflist", strings.Replace(conf("web", pluginName, "shared0", "172.26.64.0/20", "host-local"), `"type": "host-local",`, `"type": "host-local", "dataDir": "`+legacy+`",`, 1))
	h.conflist("20-other.conflist", conf("other", "bridge", "shared0", "172.26.70.0/24", "host-local"))
	h.conflist("30-broken.conflist", conf("broken", pluginName, "b0", "10.9.0.0/24", "dhcp"))
	h.conflist("40-garbage.conflist", "{not json")
	h.nomad = true
	h.tmpfs = false
	h.plugin("bridge", "CNI bridge plugin version unknown\nCNI protocol versions supported: 0.1.0, 0.2.0, 1.1.0\n")
	if err := os.Remove(filepath.Join(h.bin, "portmap")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(legacy, "web"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(legacy, "web", "172.26.64.9"), []byte("old\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := ipamdir.New(h.data, "web")
	if err := os.MkdirAll(d.Leases(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.Leases(), "172.26.64.2"), []byte("gone\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := records.NewStore(d).Write(&records.Record{Version: records.FormatVersion, Network: "web", ContainerID: "gone", IfName: "eth0", Netns: "/run/netns/gone", BootID: "boot-0", Created: boot.Add(-time.Hour), State: records.Complete}); err != nil {
		t.Fatal(err)
	}

	r := h.run()
	if r.OK {
		t.Error("a host with problems is OK")
	}
	h.golden("problems", r)
}

// A data dir is judged by what an ADD writes there (a record and a lease:
// a few KiB, a few inodes): too little for that is an error, little more
// a warning (regression: under 1 MiB was an error where ADDs worked).
func TestDataDirRoom(t *testing.T) {
	for _, c := range []struct {
		room    Room
		level   Level
		message string
	}{
		{Room{Bytes: 1 << 30, Inodes: 1 << 20}, OK, ""},
		{Room{Bytes: 512 << 10, Inodes: 1 << 20}, Warn, "nearly full: 524288 bytes and 1048576 inodes free"},
		{Room{Bytes: 1 << 30, Inodes: 100}, Warn, "nearly full: 1073741824 bytes and 100 inodes free"},
		{Room{Bytes: 32 << 10, Inodes: 1 << 20}, Error, "32768 bytes and 1048576 inodes free: an ADD cannot write its record and lease"},
		{Room{Bytes: 1 << 30, Inodes: 8}, Error, "1073741824 bytes and 8 inodes free: an ADD cannot write its record and lease"},
	} {
		h := newHost(t)
		h.conflist("10-web.conflist", conf("web", pluginName, "nbc0", "172.26.80.0/20", "host-local"))
		h.room = &c.room
		r := h.run()
		var got []Finding
		for _, f := range r.Findings {
			if f.Check == "dataDir" && f.Level != OK {
				got = append(got, f)
			}
		}
		switch {
		case c.level == OK && len(got) != 0:
			t.Errorf("room %+v: %+v", c.room, got)
		case c.level != OK && (len(got) != 1 || got[0].Level != c.level || got[0].Message != c.message):
			t.Errorf("room %+v: %+v; want %s %q", c.room, got, c.level, c.message)
		}
		if r.OK != (c.level != Error) {
			t.Errorf("room %+v: OK %v", c.room, r.OK)
		}
	}
}

// A network no container has used yet has no directory under its dataDir:
// the doctor, which only reads, must not create one (a sweep would, to
// take host-local's lock), and the network is fine.
func TestUnusedNetworkWritesNothing(t *testing.T) {
	h := newHost(t)
	h.conflist("10-web.conflist", conf("web", pluginName, "nbc0", "172.26.80.0/20", "host-local"))
	r := h.run()
	entries, err := os.ReadDir(h.data)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("doctor wrote into the dataDir of a network never used: %v", entries)
	}
	want := Finding{Level: OK, Check: "state", Subject: "web", Message: "0 live, 0 pending, 0 stale, 0 detached, 0 unknown, 0 orphan NAT rule set(s)"}
	if !slices.Contains(r.Findings, want) {
		t.Errorf("no %+v in %+v", want, r.Findings)
	}
}

// A network the plugin has not served yet in its data dir (switched from
// bare bridge, no ADD through the plugin since) keeps the NAT rules of the
// containers bare bridge added: their leases wait in the legacy directory
// for the migration, so their rules are no orphans, as the sweep that
// gc runs judges them; a container that holds nothing anywhere is one
// (regression: the doctor counted every rule set of such a network an
// orphan and told the operator to release them).
func TestUnservedNetworksRulesHeldByLegacyLeasesAreNoOrphans(t *testing.T) {
	h := newHost(t)
	legacy := filepath.Join(h.root, "legacy")
	h.conflist("10-web.conflist", conf("web", pluginName, "nbc0", "172.26.80.0/20", `host-local", "dataDir": "`+legacy))
	if err := os.MkdirAll(filepath.Join(legacy, "web"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(legacy, "web", "172.26.80.5"), []byte("bare\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	h.nat = fakenat.New()
	h.nat.AddContainer("web", "bare", "172.26.80.5", 0)
	h.nat.AddContainer("web", "gone", "172.26.80.6", 0)
	r := h.run()
	want := "0 live, 0 pending, 0 stale, 0 detached, 0 unknown, 1 orphan NAT rule set(s)"
	if !slices.ContainsFunc(r.Findings, func(f Finding) bool { return f.Check == "state" && f.Subject == "web" && f.Message == want }) {
		t.Errorf("no %+v in:\n%s", want, findings(r))
	}
	if entries, err := os.ReadDir(h.data); err != nil || len(entries) != 0 {
		t.Errorf("doctor wrote into the dataDir of a network never served: %v %v", entries, err)
	}
}

// The fix for orphan NAT rules of a network not served yet in its data dir
// is not a gc: every gc refuses the network there ("not served"), so the
// fix says what releases them (regression: it advised gc --network, which
// exits 1 and releases nothing).
func TestUnservedNetworksOrphansFixIsNoGCThatRefusesIt(t *testing.T) {
	h := newHost(t)
	h.conflist("10-web.conflist", conf("web", pluginName, "nbc0", "172.26.80.0/20", "host-local"))
	h.nat = fakenat.New()
	h.nat.AddContainer("web", "gone", "172.26.80.6", 0)
	r := h.run()
	i := slices.IndexFunc(r.Findings, func(f Finding) bool {
		return f.Check == "state" && strings.HasSuffix(f.Message, " 1 orphan NAT rule set(s)")
	})
	if i < 0 || r.Findings[i].Level != Warn || r.Findings[i].Fix == "" || strings.Contains(r.Findings[i].Fix, "nomad-bridge-cni gc") {
		t.Errorf("want a warning on the orphan, its fix no gc, in:\n%s", findings(r))
	}
}

// After the migration of this boot, the legacy leases of this boot stay
// where they are, recorded, until their runtime's DEL (reclaim
// recordMigrated): they wait for no migration, and no ADD or CHECK moves
// them (regression: the doctor said they did, until those containers
// went).
func TestMigratedLegacyLeasesDoNotWait(t *testing.T) {
	h := newHost(t)
	legacy := filepath.Join(h.root, "legacy")
	h.conflist("10-web.conflist", conf("web", pluginName, "nbc0", "172.26.80.0/20", `host-local", "dataDir": "`+legacy))
	lease := filepath.Join(legacy, "web", "172.26.80.5")
	if err := os.MkdirAll(filepath.Dir(lease), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lease, []byte("bare\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(lease, boot.Add(time.Minute), boot.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	waiting := "1 legacy lease(s) in " + filepath.Dir(lease) + " wait for the migration"
	if text := findings(h.run()); !strings.Contains(text, waiting) {
		t.Fatalf("before the migration, no %q in:\n%s", waiting, text)
	}
	m := &reclaim.Migrator{Env: reclaim.Env{Host: fakehost.New(boot)}}
	if err := m.Migrate(ipamdir.New(h.data, "web"), legacy); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(lease); err != nil {
		t.Fatalf("the migration took the legacy lease of this boot: %v", err)
	}
	if text := findings(h.run()); strings.Contains(text, "wait for the migration") {
		t.Errorf("after the migration of this boot:\n%s", text)
	}
}

// The legacy leases the doctor counts are those the migration takes: the
// network's legacy directory opened without following a symlink, and in
// it only regular files named by an address that hold a reservation
// (regression: a legacy directory that was a symlink to /etc was
// followed, and its every file counted, "N legacy lease(s) … wait for the
// migration" for good, while the migration refuses the link and every
// ADD of the network fails on it).
func TestLegacyLeasesAreCountedAsTheMigrationTakesThem(t *testing.T) {
	h := newHost(t)
	legacy := filepath.Join(h.root, "legacy")
	h.conflist("10-web.conflist", conf("web", pluginName, "nbc0", "172.26.80.0/20", `host-local", "dataDir": "`+legacy))
	etc := filepath.Join(h.root, "etc")
	for _, d := range []string{legacy, etc} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"passwd", "hosts", "10.0.0.1"} {
		if err := os.WriteFile(filepath.Join(etc, f), []byte("root:x:0:0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	net := ipamdir.New(legacy, "web").Leases()
	if err := os.Symlink(etc, net); err != nil {
		t.Fatal(err)
	}
	m := &reclaim.Migrator{Env: reclaim.Env{Host: fakehost.New(boot)}}
	if err := m.Migrate(ipamdir.New(h.data, "web"), legacy); err == nil {
		t.Fatal("the migration took a symlinked legacy directory")
	}
	r := h.run()
	text := findings(r)
	if strings.Contains(text, "wait for the migration") {
		t.Errorf("the doctor counted the files of a symlinked legacy directory as leases:\n%s", text)
	}
	if !slices.ContainsFunc(r.Findings, func(f Finding) bool {
		return f.Level == Error && f.Check == "state" && f.Subject == "web" && strings.Contains(f.Message, net) && strings.Contains(f.Message, "symlink")
	}) {
		t.Errorf("no error says the migration refuses %s:\n%s", net, text)
	}

	// A real legacy directory: a lease, and what the migration passes
	// over (a file not named by an address, a damaged lease, a directory
	// and a symlink named by one, host-local's bookkeeping).
	if err := os.Remove(net); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(net, "172.26.80.7"), 0o755); err != nil {
		t.Fatal(err)
	}
	for f, body := range map[string]string{"172.26.80.5": "bare\r\neth0", "passwd": "bare\r\neth0", "172.26.80.6": "", "lock": "", "last_reserved_ip.0": "172.26.80.5"} {
		if err := os.WriteFile(filepath.Join(net, f), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(etc, "passwd"), filepath.Join(net, "172.26.80.8")); err != nil {
		t.Fatal(err)
	}
	r = h.run()
	want := "1 legacy lease(s) in " + net + " wait for the migration"
	if text := findings(r); !strings.Contains(text, want) || slices.ContainsFunc(r.Findings, isError) {
		t.Errorf("want %q and no error in:\n%s", want, text)
	}
}

// stale writes a stale attachment of network web: a record from another
// boot that lists cidrs, and a lease of each.
func (h *host) stale(id string, cidrs ...string) {
	h.t.Helper()
	d := ipamdir.New(h.data, "web")
	if err := os.MkdirAll(d.Leases(), 0o755); err != nil {
		h.t.Fatal(err)
	}
	r := &records.Record{Version: records.FormatVersion, Network: "web", ContainerID: id, IfName: "eth0", Netns: "/run/netns/" + id, BootID: "boot-0", Created: boot.Add(-time.Hour), State: records.Complete}
	for _, cidr := range cidrs {
		ip, _, _ := strings.Cut(cidr, "/")
		if err := os.WriteFile(filepath.Join(d.Leases(), ip), []byte(id+"\r\neth0"), 0o600); err != nil {
			h.t.Fatal(err)
		}
		r.IPs = append(r.IPs, cidr)
	}
	if err := records.NewStore(d).Write(r); err != nil {
		h.t.Fatal(err)
	}
}

// The state finding counts attachments, as its words and the metrics
// command do, not leases: a dual-stack attachment is one (regression: it
// counted a row of `leases` per lease, so twice).
func TestStateCountsAttachmentsNotLeases(t *testing.T) {
	h := newHost(t)
	h.conflist("10-web.conflist", conf("web", pluginName, "nbc0", "172.26.80.0/20", "host-local"))
	h.stale("dual", "172.26.80.2/20", "fd00::2/64")
	h.stale("single", "172.26.80.3/20")
	r := h.run()
	want := "0 live, 0 pending, 2 stale, 0 detached, 0 unknown, 0 orphan NAT rule set(s)"
	if !slices.ContainsFunc(r.Findings, func(f Finding) bool { return f.Check == "state" && f.Subject == "web" && f.Message == want }) {
		t.Errorf("no state finding %q (two attachments, three leases) in:\n%s", want, findings(r))
	}
}

// What the sweep skipped (a damaged lease, a file that is not one) is
// worth a look, as `leases` lists it (regression: the doctor dropped it and
// could call the network fine).
func TestStateSaysWhatTheSweepSkipped(t *testing.T) {
	h := newHost(t)
	h.conflist("10-web.conflist", conf("web", pluginName, "nbc0", "172.26.80.0/20", "host-local"))
	leases := ipamdir.New(h.data, "web").Leases()
	for _, d := range []string{leases, filepath.Join(leases, "172.26.80.9")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(leases, "not-an-address"), []byte("x\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := h.run()
	want := Finding{Level: Warn, Check: "state", Subject: "web", Message: "2 damaged or foreign file(s) skipped: neither judged nor counted",
		Fix: "see nomad-bridge-cni leases --data-dir " + h.data + " --network web: it lists them, each with why"}
	if !slices.Contains(r.Findings, want) {
		t.Errorf("no %+v in:\n%s", want, findings(r))
	}
}

// A FIFO in a conf dir never hangs the doctor, and a conflist bigger than
// the plugin reads of an entry is an error, not fine: every ADD of it is
// refused.
func TestDoctorOnPlantedAndHugeConflists(t *testing.T) {
	h := newHost(t)
	h.conflist("10-web.conflist", conf("web", pluginName, "nbc0", "172.26.80.0/20", "host-local"))
	dirstate.PlantFIFO(t, filepath.Join(h.conf, "20-fifo.conflist"))
	huge := strings.Replace(conf("huge", pluginName, "nbc1", "172.26.96.0/20", "host-local"), `"name"`, `"padding": "`+strings.Repeat("x", 2<<20)+`", "name"`, 1)
	h.conflist("30-huge.conflist", huge)
	done := make(chan *Report, 1)
	go func() { done <- h.run() }()
	var r *Report
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("doctor hangs on a FIFO in a conf dir")
	}
	if r.OK {
		t.Error("doctor calls a host with a conflist over 1 MiB fine")
	}
	var fifo, big bool
	for _, f := range r.Findings {
		fifo = fifo || f.Level == Error && strings.HasSuffix(f.Subject, "20-fifo.conflist") && strings.Contains(f.Message, "not a regular file")
		big = big || f.Level == Error && strings.HasSuffix(f.Subject, "30-huge.conflist") && strings.Contains(f.Message, "larger than")
	}
	if !fifo || !big {
		t.Errorf("findings %+v; want an error for the FIFO and one for the huge conflist", r.Findings)
	}
}

// Installed as bridge in front of the reference plugins, the plugin owns
// the conflists' "type": "bridge" entries: the doctor checks them as its
// own (dataDir, state) and the reference bridge past the front copy. With
// no reference bridge after it, every ADD fails: an error.
func TestFrontMode(t *testing.T) {
	h := newHost(t)
	front := filepath.Join(h.root, "front")
	frontBridge := h.frontCopy(front)
	// As it prints with no arguments: the reference bridge's lines first.
	h.versions[frontBridge] = "CNI bridge plugin v1.10.0\nCNI protocol versions supported: 0.1.0, 1.1.0\nCNI nomad-bridge-cni plugin v0.1.0, in front of " + filepath.Join(h.bin, "bridge") + "\n"
	h.front = []string{front}
	h.conflist("10-web.conflist", conf("web", "bridge", "web0", "172.26.80.0/20", "host-local"))
	h.tmpfs = false
	r := h.run()
	has := func(level Level, check, subject, message string) bool {
		return slices.ContainsFunc(r.Findings, func(f Finding) bool {
			return f.Level == level && f.Check == check && f.Subject == subject && strings.Contains(f.Message, message)
		})
	}
	for _, want := range []struct {
		level                   Level
		check, subject, message string
	}{
		{OK, "plugin", frontBridge, "installed as bridge: the conflists' \"type\": \"bridge\" entries with host-local are its; it delegates to " + filepath.Join(h.bin, "bridge")},
		{OK, "conflist", filepath.Join(h.conf, "10-web.conflist"), `network "web" uses nomad-bridge-cni (installed as "bridge")`},
		{OK, "plugin", filepath.Join(h.bin, "bridge"), "version v1.10.0"},
		{Warn, "dataDir", h.data, "not a tmpfs"},
		{OK, "state", "web", "0 live"},
	} {
		if !has(want.level, want.check, want.subject, want.message) {
			t.Errorf("no %s %s %s %q in:\n%s", want.level, want.check, want.subject, want.message, findings(r))
		}
	}
	if has(Warn, "conflist", strings.Join([]string{h.conf, filepath.Join(h.root, "absent")}, ", "), "no conflist uses") {
		t.Errorf("front mode still says no conflist uses the plugin:\n%s", findings(r))
	}

	if err := os.Remove(filepath.Join(h.bin, "bridge")); err != nil {
		t.Fatal(err)
	}
	r = h.run()
	if r.OK || !has(Error, "plugin", frontBridge, "no reference bridge after it") {
		t.Errorf("front copy with no reference bridge after it: OK=%v\n%s", r.OK, findings(r))
	}
}

// Run as another user, the doctor says so once, and does not call root's
// directories unsafe (their owner is the plugin's) nor read their state.
func TestNotRoot(t *testing.T) {
	h := newHost(t)
	h.conflist("10-web.conflist", conf("web", pluginName, "nbc0", "172.26.80.0/20", "host-local"))
	leases := ipamdir.New(h.data, "web").Leases()
	if err := os.MkdirAll(leases, 0o755); err != nil {
		t.Fatal(err)
	}
	// Owned by another uid than this process's, as root's directories are
	// to a user who runs the doctor: ipamdir's check calls them unsafe.
	for _, d := range []string{h.data, leases} {
		if err := os.Chown(d, 4242, 4242); err != nil {
			testhost.SkipOrFail(t, fmt.Sprintf("chown needs root: %v", err))
		}
	}
	h.euid = 4242
	r := h.run()
	if !r.OK {
		t.Errorf("not OK as another user:\n%s", findings(r))
	}
	want := Finding{Level: Warn, Check: "doctor", Subject: "uid 4242", Message: "not run as root: the plugin runs as root, so its data dirs, leases and NAT rules are not judged from here", Fix: "sudo nomad-bridge-cni doctor"}
	if len(r.Findings) == 0 || r.Findings[0] != want {
		t.Errorf("first finding is not %+v:\n%s", want, findings(r))
	}
	for _, f := range r.Findings {
		if strings.Contains(f.Message, "unsafe") || strings.Contains(f.Fix, "chown") || f.Check == "state" {
			t.Errorf("as another user: %+v", f)
		}
	}
}

func findings(r *Report) string {
	var b bytes.Buffer
	WriteText(&b, r)
	return b.String()
}

// The host's probe reads root's room: some bytes and inodes in a temp dir,
// and an error where there is no directory.
func TestFreeRoom(t *testing.T) {
	r, err := freeRoom(t.TempDir())
	if err != nil || r.Bytes == 0 || r.Inodes == 0 {
		t.Errorf("freeRoom(temp dir) = %+v, %v", r, err)
	}
	if _, err := freeRoom(filepath.Join(t.TempDir(), "absent")); err == nil {
		t.Error("freeRoom of no directory: no error")
	}
}

// A FIFO planted as a network's record directory, or as its directory in
// the legacy lease dir, never hangs the doctor (regression: the state
// check opened both blocking, and waited for ever).
func TestDoctorOnPlantedStateDirs(t *testing.T) {
	for _, where := range []string{"records", "legacy"} {
		t.Run(where, func(t *testing.T) {
			h := newHost(t)
			legacy := filepath.Join(h.root, "legacy")
			h.conflist("10-web.conflist", strings.Replace(conf("web", pluginName, "nbc0", "172.26.80.0/20", "host-local"), `"ranges"`, `"dataDir": "`+legacy+`", "ranges"`, 1))
			h.stale("gone", "172.26.80.2/20")
			fifo := ipamdir.New(legacy, "web").Leases()
			if where == "records" {
				fifo = ipamdir.New(h.data, "web").Records()
				if err := os.RemoveAll(fifo); err != nil {
					t.Fatal(err)
				}
			}
			dirstate.PlantFIFO(t, fifo)
			done := make(chan *Report, 1)
			go func() { done <- h.run() }()
			select {
			case r := <-done:
				if where == "records" && !slices.ContainsFunc(r.Findings, func(f Finding) bool { return f.Check == "state" && strings.Contains(f.Message, fifo) }) {
					t.Errorf("no state finding says why %s was not read:\n%s", fifo, findings(r))
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("doctor hangs on a FIFO at %s", fifo)
			}
		})
	}
}

// A plugin run for its version that leaves a child holding its output
// open (a wrapper script's daemon) does not keep the doctor waiting past
// its bound (regression: it waited for the child to exit).
func TestPluginVersionDoesNotWaitForItsChildren(t *testing.T) {
	plugin := filepath.Join(t.TempDir(), "bridge")
	testhost.ScriptLeavingAChild(t, plugin, "CNI bridge plugin v1.10.0")
	start := time.Now()
	out, _ := pluginVersion(plugin)
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("pluginVersion took %v", took)
	}
	if !strings.Contains(out, "v1.10.0") {
		t.Errorf("pluginVersion = %q, want what the plugin printed", out)
	}
}

// What the doctor prints of a file, a conflist's name or an entry's
// plugin type, reaches the terminal escaped, as the other commands print
// what files name (regression: WriteText printed them raw, so a conflist
// named with an escape sequence, in a --conf-dir or Nomad's
// cni_config_dir, cleared or recoloured the operator's terminal).
func TestDoctorTextEscapesWhatATerminalWouldObey(t *testing.T) {
	h := newHost(t)
	h.conflist("10-web\x1b[2J.conflist", conf("web", pluginName, "nbc0", "172.26.80.0/20", "host-local"))
	h.conflist("20-bad\x1b]0;owned\a.conflist", "{not json")
	h.conflist("30-db.conflist", strings.Replace(conf("db", pluginName, "nbc1", "172.26.96.0/20", "host-local"), `"portmap"`, `"port\u001b[31mmap\u202e"`, 1))
	text := findings(h.run())
	if strings.ContainsFunc(text, func(r rune) bool { return r != '\n' && !unicode.IsGraphic(r) }) {
		t.Errorf("the text has control or format characters:\n%q", text)
	}
	for _, want := range []string{`10-web\x1b[2J.conflist`, `20-bad\x1b]0;owned\a.conflist`, `port\x1b[31mmap\u202e`} {
		if !strings.Contains(text, want) {
			t.Errorf("no %s in:\n%s", want, text)
		}
	}
}

// Installed as bridge in front of Nomad's cni_path, the plugin serves the
// "type": "bridge" entries of Nomad's cni_config_dir only: another
// runtime's directory, read with that runtime's plugin dirs (containerd's
// /opt/cni/bin and the reference bridge there), keeps bare bridge's
// (regression: every conf dir's bridge entries were called the plugin's,
// their leases "waiting for the migration" for ever).
func TestFrontServesOnlyTheDirsWhosePathItFronts(t *testing.T) {
	h := newHost(t)
	front, other := filepath.Join(h.root, "front"), filepath.Join(h.root, "containerd-net.d")
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	h.frontCopy(front)
	h.conflist("10-web.conflist", conf("web", "bridge", "web0", "172.26.80.0/20", "host-local"))
	if err := os.WriteFile(filepath.Join(other, "10-ctr.conflist"), []byte(strings.ReplaceAll(conf("ctr", "bridge", "ctr0", "172.26.96.0/20", "host-local"), "DATA", h.data)), 0o644); err != nil {
		t.Fatal(err)
	}
	r := Run(Options{
		ConfDirs: []string{other}, CNIPath: []string{"/opt/cni/bin"}, Nomad: true, EUID: 1000,
		NomadClient: func() NomadClient {
			return nomadSettings{CNIPath: front + ":" + h.bin, CNIConfigDir: h.conf}.resolve("test")
		},
		Readers: map[string]conflists.Reader{other: {Runtimes: "containerd", PluginDirs: []string{h.bin}}},
		Version: h.version,
		OnTmpfs: func(string) (bool, error) { return true, nil },
		Free:    func(string) (Room, error) { return plenty, nil },
	})
	text := findings(r)
	if !strings.Contains(text, `network "web" uses nomad-bridge-cni (installed as "bridge")`) || strings.Contains(text, "10-ctr.conflist") {
		t.Errorf("want web the plugin's and ctr bare bridge's in:\n%s", text)
	}
}
