package containerd

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
		fmt.Fprintf(os.Stderr, "containerd tests: restoring host state: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	removePauseBuild()
	os.Exit(code)
}

// hostContainerdPaths are the host's containerd configuration and default
// state: the tests' containerd uses its own and must leave these exactly as
// they were (or absent).
var hostContainerdPaths = []string{"/etc/containerd", "/var/lib/containerd", "/run/containerd", "/etc/cni", "/etc/crictl.yaml"}

// snapshotDirs are created on first use by containerd or libcni outside the
// test's directories: containerd 1.6's shim sockets (/run/containerd/s,
// whatever the state directory), the namespaces' directory, libcni's cache
// of results (go-cni keeps its default). Removed at the end if the package
// created them and they are empty.
var snapshotDirs = []string{
	shimSocketDir,
	filepath.Dir(shimSocketDir),
	netnsDir,
	libcniCacheDir,
	filepath.Dir(libcniCacheDir),
}

type hostSnapshot struct {
	*testhost.Snapshot
	containerd map[string]string
}

func snapshotHost() *hostSnapshot {
	if len(missingHostPrereqs()) > 0 {
		return &hostSnapshot{} // the tests skip or fail; they create nothing
	}
	return &hostSnapshot{
		Snapshot:   testhost.TakeSnapshot(snapshotDirs),
		containerd: fingerprint(hostContainerdPaths),
	}
}

// restore removes the shared chains and directories the package created
// and left idle, and reports any change to the host's containerd paths.
func (s *hostSnapshot) restore() error {
	if s.Snapshot == nil {
		return nil
	}
	var errs []error
	for _, fam := range iptstate.Families {
		existed := func(table, chain string) bool { return s.ChainExisted(fam, table, chain) }
		errs = append(errs, iptstate.RemoveIdleSharedChains(fam, existed, nil)...)
	}
	errs = append(errs, s.RestoreSysctlsAndDirs()...)
	if after := fingerprint(hostContainerdPaths); !maps.Equal(after, s.containerd) {
		errs = append(errs, fmt.Errorf("the host's containerd paths changed: %s", fingerprintDiff(s.containerd, after)))
	}
	return errors.Join(errs...)
}

// fingerprint maps every file, directory and link under paths to its mode
// and content hash (or link target); a missing path maps to nothing.
func fingerprint(paths []string) map[string]string {
	out := map[string]string{}
	for _, root := range paths {
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if !errors.Is(err, fs.ErrNotExist) {
					out[p] = "error: " + err.Error()
				}
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

func fingerprintDiff(before, after map[string]string) string {
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

// ---------------------------------------------------------------------------
// Prerequisites

// hostTools are what the tests run besides the binaries in NBC_BIN_DIR.
var hostTools = []string{"containerd", "ctr", "containerd-shim-runc-v2", "runc", "ip", "iptables", "ip6tables", "nsenter", "umount"}

var hostPrereqs = testhost.Prereqs{What: "containerd test prerequisites", Hint: ".ci/run installs containerd and runc with apt-get", Check: missingHostPrereqs}

// requireHost skips the test, saying why, when the host cannot run
// containerd; with CI set it fails instead.
func requireHost(t *testing.T) {
	t.Helper()
	hostPrereqs.Require(t)
}

func missingHostPrereqs() []string {
	missing := testhost.MissingTools(hostTools...)
	if len(missing) > 0 {
		return missing
	}
	for _, ipt := range iptstate.Families {
		if _, err := iptstate.Read(ipt, "nat"); err != nil {
			missing = append(missing, fmt.Sprintf("a working %s nat table (%v)", ipt, err))
		}
	}
	return missing
}
