package plugin

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

// An ipam.dataDir that names the plugin's dataDir through a link (Nomad's
// "/var/run/cni" with "dataDir": "/run/cni", /var/run a link to /run) is
// no legacy directory: nothing is migrated from it. Before, once the
// network had leases, every ADD took host-local's lock through each name,
// waited on itself until the lock's timeout, and failed (code 5, "failed
// to migrate leases").
func TestAddWithIPAMDataDirNamingTheDataDirThroughALink(t *testing.T) {
	h := newHarness(t, "bridge")
	h.exec.reply["bridge ADD"] = bridgeResult100
	h.host.Namespaces["/var/run/netns/y"] = sysinfo.NetnsID{Dev: 4, Ino: 1001}
	old := ipamdir.LockTimeout
	ipamdir.LockTimeout = time.Second
	t.Cleanup(func() { ipamdir.LockTimeout = old })
	alias := filepath.Join(t.TempDir(), "var-run-cni")
	if err := os.Symlink(h.dataDir, alias); err != nil {
		t.Fatal(err)
	}
	h.served()
	conf := bytes.Replace(h.conf("1.0.0", ""), []byte(`"type":"host-local"`), []byte(`"type":"host-local","dataDir":"`+alias+`"`), 1)
	for _, a := range []struct{ cid, netns, lease string }{{"c1", "/var/run/netns/x", "172.26.64.2"}, {"c2", "/var/run/netns/y", "172.26.64.3"}} {
		args := h.args(conf)
		args.ContainerID, args.Netns = a.cid, a.netns
		if err := h.plugin.Funcs().Add(args); err != nil {
			t.Fatalf("ADD %s: %v", a.cid, err)
		}
		// The lease host-local wrote.
		if err := os.WriteFile(filepath.Join(h.dataDir, "nomad", a.lease), []byte(a.cid+"\r\neth0"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Contains(h.stderr.String(), "migrated") {
		t.Errorf("the dataDir was migrated onto itself: %s", h.stderr.String())
	}
}

// An ADD host-local refuses because the container already holds an
// address ("duplicate allocation is not allowed") made nothing: the lease
// it ran into is an earlier attachment's, and the failed ADD's clean-up
// (Abort) must leave it (docs/reclaim.md: a lease from this boot with no
// record is never released). Regression: Abort released every lease
// naming the attachment, so the refused ADD took the address of a
// container that may still run with it (host-local then hands it out
// again), and its NAT rules. Such a lease is in the data dir, written by
// something else, or copied there by the migration this same ADD ran (a
// container the bare bridge chain added, ADDed again right after the
// one-word edit: the migration found the ADD's pending record, kept the
// copy and removed the legacy lease). One from before this boot is stale,
// and still goes.
func TestRefusedADDKeepsTheLeaseItRanInto(t *testing.T) {
	for _, where := range []string{"data-dir", "legacy-dir", "data-dir-before-boot"} {
		t.Run(where, func(t *testing.T) {
			h := newHarness(t, "bridge")
			legacy := t.TempDir()
			h.served()
			dir := filepath.Join(h.dataDir, "nomad")
			if where == "legacy-dir" {
				dir = filepath.Join(legacy, "nomad")
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			written := time.Now().Add(-time.Minute) // this boot (the fake host booted in 2025)
			if where == "data-dir-before-boot" {
				written = h.host.Boot.Add(-time.Hour)
			}
			lease := filepath.Join(dir, "172.26.64.5")
			if err := os.WriteFile(lease, []byte("c1\r\neth0"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(lease, written, written); err != nil {
				t.Fatal(err)
			}
			h.exec.fail["bridge ADD"] = types.NewError(types.ErrInternal, "failed to allocate for range 0: 172.26.64.5 has been allocated to c1, duplicate allocation is not allowed", "")
			conf := bytes.Replace(h.conf("1.0.0", ""), []byte(`"type":"host-local"`), []byte(`"type":"host-local","dataDir":"`+legacy+`"`), 1)
			if err := h.plugin.Funcs().Add(h.args(conf)); err == nil {
				t.Fatal("ADD succeeded")
			}
			var left []string
			for _, d := range []string{filepath.Join(h.dataDir, "nomad"), filepath.Join(legacy, "nomad")} {
				if b, err := os.ReadFile(filepath.Join(d, "172.26.64.5")); err == nil && string(b) == "c1\r\neth0" {
					left = append(left, d)
				}
			}
			switch {
			case where == "data-dir-before-boot" && len(left) != 0:
				t.Errorf("the lease from before this boot stayed in %v", left)
			case where != "data-dir-before-boot" && len(left) == 0:
				t.Errorf("no lease of c1 is left: the refused ADD released the one it ran into; stderr:\n%s", h.stderr.String())
			}
			if _, err := os.Lstat(filepath.Join(h.dataDir, ipamdir.RecordDirName, "nomad", "c1@eth0")); err == nil {
				t.Error("the refused ADD left its pending record")
			}
		})
	}
}

// A container the bare bridge chain added, CHECKed through the plugin
// before any ADD after the one-word edit (Nomad's restore when its client
// restarts with the new conflist, or with the plugin installed as bridge in
// front of cni_path): host-local must find its lease, so the legacy
// leases are migrated before the delegate runs. Regression: CHECK showed
// host-local the data dir (or an empty one) with the lease still in the
// legacy directory, and failed; Nomad then re-created the allocation's
// namespace and re-ADDed, which the plugin refused (the migrated lease still
// named the running container), and the allocation was killed.
func TestCheckOfABareBridgeContainerAfterTheSwitchFindsItsLease(t *testing.T) {
	h := newHarness(t, "bridge")
	legacy := t.TempDir()
	if err := os.MkdirAll(filepath.Join(legacy, "nomad"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(legacy, "nomad", "172.26.64.5"), []byte("c1\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	// host-local's CHECK: a lease naming the container in its dataDir.
	h.exec.failIf = func(call execCall) error {
		if call.Command != "CHECK" {
			return nil
		}
		dir, _ := delegatedConf(t, call)["ipam"].(map[string]any)["dataDir"].(string)
		if b, err := os.ReadFile(filepath.Join(dir, "nomad", "172.26.64.5")); err != nil || string(b) != "c1\r\neth0" {
			return types.NewError(types.ErrInternal, "host-local: Failed to find address added by container c1", "")
		}
		return nil
	}
	conf := bytes.Replace(h.conf("1.0.0", `,"prevResult":`+bridgeResult100), []byte(`"type":"host-local"`), []byte(`"type":"host-local","dataDir":"`+legacy+`"`), 1)
	if err := h.plugin.Funcs().Check(h.args(conf)); err != nil {
		t.Fatalf("CHECK of the running container failed: %v\nstderr:\n%s", err, h.stderr.String())
	}
}

// A container the bare bridge chain added, DELeted through the plugin
// before any ADD after the one-word edit (a runtime that reloads the
// conflist: containerd, CRI-O, cnitool): its legacy lease goes with it.
// Regression: DEL ran host-local on the data dir only, so the legacy lease
// stayed; the next ADD migrated it, and the address stayed held for the
// rest of the boot by a container that was gone (a migrated lease is live
// while its legacy file names the container).
func TestDelOfABareBridgeContainerAfterTheSwitchReleasesItsLegacyLease(t *testing.T) {
	h := newHarness(t, "bridge")
	legacy := t.TempDir()
	if err := os.MkdirAll(filepath.Join(legacy, "nomad"), 0o755); err != nil {
		t.Fatal(err)
	}
	lease := filepath.Join(legacy, "nomad", "172.26.64.5")
	if err := os.WriteFile(lease, []byte("c1\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	// host-local's DEL: the leases naming the container in its dataDir go.
	h.exec.failIf = func(call execCall) error {
		if call.Command == "DEL" {
			dir, _ := delegatedConf(t, call)["ipam"].(map[string]any)["dataDir"].(string)
			if b, err := os.ReadFile(filepath.Join(dir, "nomad", "172.26.64.5")); err == nil && string(b) == "c1\r\neth0" {
				return os.Remove(filepath.Join(dir, "nomad", "172.26.64.5"))
			}
		}
		return nil
	}
	conf := bytes.Replace(h.conf("1.0.0", `,"prevResult":`+bridgeResult100), []byte(`"type":"host-local"`), []byte(`"type":"host-local","dataDir":"`+legacy+`"`), 1)
	if err := h.plugin.Funcs().Del(h.args(conf)); err != nil {
		t.Fatalf("DEL: %v\nstderr:\n%s", err, h.stderr.String())
	}
	for _, path := range []string{lease, filepath.Join(h.dataDir, "nomad", "172.26.64.5")} {
		if b, err := os.ReadFile(path); err == nil && string(b) == "c1\r\neth0" {
			t.Errorf("the DELeted container's lease %s is still held\nstderr:\n%s", path, h.stderr.String())
		}
	}
}

// An ADD whose legacy-lease migration fails is refused with an I/O error
// (code 5) that says so, bridge never run, and nothing else on stderr: the
// refusal is the operator's one line to act on.
func TestAddRefusedForAFailedMigrationSaysOnlyThat(t *testing.T) {
	h := newHarness(t, "bridge")
	h.plugin.onTmpfs = func(ipamdir.Dir) (bool, int64, error) { return true, 0x01021994, nil }
	legacy := t.TempDir()
	// A legacy network directory that is a symlink: the migration opens
	// no link, and fails.
	if err := os.Symlink(t.TempDir(), filepath.Join(legacy, "nomad")); err != nil {
		t.Fatal(err)
	}
	conf := bytes.Replace(h.conf("1.0.0", ""), []byte(`"type":"host-local"`), []byte(`"type":"host-local","dataDir":"`+legacy+`"`), 1)
	err := h.plugin.Funcs().Add(h.args(conf))
	var cniErr *types.Error
	if !errors.As(err, &cniErr) || cniErr.Code != types.ErrIOFailure || !strings.Contains(cniErr.Msg, "migrate") {
		t.Fatalf("ADD = %#v, want code %d naming the migration", err, types.ErrIOFailure)
	}
	if len(h.exec.calls) != 0 {
		t.Errorf("bridge run after a failed migration: %+v", h.exec.calls)
	}
	if h.stderr.Len() != 0 {
		t.Errorf("stderr = %q, want nothing besides the refusal", h.stderr.String())
	}
}
