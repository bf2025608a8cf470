package podman

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/iptstate"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

func TestMain(m *testing.M) {
	snap := snapshotHost()
	code := m.Run()
	if err := snap.restore(); err != nil {
		fmt.Fprintf(os.Stderr, "podman tests: restoring host state: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// hostConfigPaths are the host's podman and CNI configuration: the tests
// point podman elsewhere and must leave these exactly as they were.
var hostConfigPaths = []string{"/etc/containers", "/usr/share/containers", "/etc/cni", "/root/.config/containers"}

// hostAccountPaths are what the rootless test changes for its duration:
// the account files (and their backups) its throw-away user goes into,
// and the tun device's mode. They must be as they were at the end.
func hostAccountPaths() []string {
	var out []string
	for _, f := range accountFiles {
		out = append(out, f, f+"-")
	}
	return append(out, tunDevice)
}

// hostStatePaths are podman's default state paths: the tests' podman uses
// its own, so none of these may appear.
var hostStatePaths = []string{"/var/lib/containers/storage", "/run/containers", "/run/libpod", "/dev/shm/libpod_lock"}

// Directories the plugins (tuning's under the plugin's default dataDir),
// libcni, containers/image or runc create on first use (`podman import` as root keeps its blob cache in /var/lib/containers
// whatever the storage root).
var snapshotDirs = []string{
	libcniCacheDir,
	filepath.Dir(libcniCacheDir),
	hostLocalDefaultDir,
	filepath.Join(pluginDefaultDataDir, recordDirName),
	tuningDataDir,
	pluginDefaultDataDir,
	blobInfoCache,
	filepath.Dir(blobInfoCache),
	filepath.Dir(filepath.Dir(blobInfoCache)),
	runcStateDir,
}

const blobInfoCache = "/var/lib/containers/cache/blob-info-cache-v1.boltdb"

// hostSnapshot is what the host looked like before the package ran (see
// testhost.Snapshot), with the host's podman configuration and accounts.
type hostSnapshot struct {
	*testhost.Snapshot
	config  map[string]string
	account map[string]string
}

func snapshotHost() *hostSnapshot {
	if len(missingHostPrereqs()) > 0 {
		return &hostSnapshot{} // the tests skip or fail; they create nothing
	}
	return &hostSnapshot{
		Snapshot: testhost.TakeSnapshot(snapshotDirs, hostStatePaths...),
		config:   fingerprint(hostConfigPaths),
		account:  fingerprint(hostAccountPaths()),
	}
}

// fingerprint maps every file, directory and link under paths to its mode
// and content hash (or link target).
func fingerprint(paths []string) map[string]string {
	out := map[string]string{}
	for _, root := range paths {
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				out[p] = "error: " + err.Error()
				return nil
			}
			info, err := d.Info()
			if err != nil {
				out[p] = "error: " + err.Error()
				return nil
			}
			out[p] = info.Mode().String()
			switch {
			case info.Mode().IsRegular():
				raw, err := os.ReadFile(p)
				out[p] += fmt.Sprintf(" %x %v", sha256.Sum256(raw), err)
			case info.Mode()&fs.ModeSymlink != 0:
				target, err := os.Readlink(p)
				out[p] += " -> " + target + fmt.Sprint(err)
			}
			return nil
		})
	}
	return out
}

// restore removes what the package created that nobody else uses, and
// reports a change to the host's podman configuration or state.
func (s *hostSnapshot) restore() error {
	if s.Snapshot == nil {
		return nil
	}
	var errs []error
	for _, fam := range iptstate.Families {
		errs = append(errs, s.restoreSharedChains(fam)...)
	}
	errs = append(errs, s.RestoreSysctlsAndDirs()...)
	for _, p := range hostStatePaths {
		if _, err := os.Lstat(p); err == nil && !s.Existed(p) {
			errs = append(errs, fmt.Errorf("podman's default state %s appeared: a podman command ran without the test's configuration", p))
		}
	}
	if after := fingerprint(hostConfigPaths); !maps.Equal(after, s.config) {
		errs = append(errs, fmt.Errorf("the host's podman configuration changed: %s", configDiff(s.config, after)))
	}
	if after := fingerprint(hostAccountPaths()); !maps.Equal(after, s.account) {
		errs = append(errs, fmt.Errorf("the host's accounts or %s changed: %s", tunDevice, configDiff(s.account, after)))
	}
	return errors.Join(errs...)
}

func configDiff(before, after map[string]string) string {
	var diff []string
	for _, p := range slices.Sorted(maps.Keys(before)) {
		if a, ok := after[p]; !ok {
			diff = append(diff, "removed "+p)
		} else if a != before[p] {
			diff = append(diff, "changed "+p)
		}
	}
	for _, p := range slices.Sorted(maps.Keys(after)) {
		if _, ok := before[p]; !ok {
			diff = append(diff, "added "+p)
		}
	}
	return strings.Join(diff, ", ")
}

// restoreSharedChains deletes the shared portmap and firewall chains that
// did not exist before the package ran, once idle; the firewall plugin's
// admin chain first, which CNI-FORWARD jumps to (see
// iptstate.RemoveIdleSharedChains).
func (s *hostSnapshot) restoreSharedChains(fam string) []error {
	existed := func(table, chain string) bool { return s.ChainExisted(fam, table, chain) }
	var errs []error
	if !existed("filter", firewallAdminChain) {
		errs = append(errs, removeIdleAdminChain(fam)...)
	}
	return append(errs, iptstate.RemoveIdleSharedChains(fam, existed, func(table, chain string, rules []iptstate.Rule) {
		fmt.Fprintf(os.Stderr, "podman tests: leaving %s -t %s %s, it is in use (%d rules)\n", fam, table, chain, len(rules))
	})...)
}

// removeIdleAdminChain deletes an empty CNI-ADMIN and the jumps to it.
func removeIdleAdminChain(fam string) []error {
	tb, err := iptstate.Read(fam, "filter")
	if err != nil {
		return []error{err}
	}
	if !tb.Chains[firewallAdminChain] || len(tb.RulesIn(firewallAdminChain)) > 0 {
		return nil
	}
	var errs []error
	for _, r := range tb.Rules {
		if r.Target() == firewallAdminChain {
			if err := iptstate.DeleteRule(fam, "filter", r); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) == 0 {
		if err := iptstate.DropChain(fam, "filter", firewallAdminChain); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
