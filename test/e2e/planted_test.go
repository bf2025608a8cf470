package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
)

// plantedBound is how long a verb or a command may take on a planted
// file: far below delegateTimeout (2 min), which bounded them before.
const plantedBound = 15 * time.Second

// TestPlantedFilesNeverHang: regression test. A FIFO planted as
// host-local's lock hung `leases`, `gc` and CHECK for ever, and ADD, DEL
// and CHECK until delegateTimeout (host-local opens its lock blocking); a
// FIFO planted as a lease did the same to DEL and CHECK (host-local reads
// every lease); a symlinked lock made `leases`, `gc --dry-run` and CHECK
// create its target outside the data dir. Now each verb refuses at once
// (code 5, naming the file), `leases` and `gc` finish and say why they
// skipped the network, nothing is created through the link, and once the
// file is gone everything works again.
func TestPlantedFilesNeverHang(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, e *testEnv, outside string) string
		says  string
	}{
		{"fifo-lock", func(t *testing.T, e *testEnv, _ string) string {
			p := filepath.Join(e.leaseDir(), "lock")
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			return mkfifo(t, p)
		}, "FIFO"},
		{"fifo-lease", func(t *testing.T, e *testEnv, _ string) string {
			return mkfifo(t, filepath.Join(e.leaseDir(), e.hostAddr(200).String()))
		}, "FIFO"},
		{"symlinked-lock", func(t *testing.T, e *testEnv, outside string) string {
			p := filepath.Join(e.leaseDir(), "lock")
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(outside, "created-through-the-link"), p); err != nil {
				t.Fatal(err)
			}
			return p
		}, "symlink"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			e.writeConflist(t, e.reclaimConf(t, "minimal.conflist"))
			live, other := e.addNetns(t, "live"), e.addNetns(t, "other")
			e.mustCNI(t, "add", live, "")
			outside := t.TempDir()
			planted := tc.plant(t, e, outside)

			entry := mustJSON(t, hostileEntry(t, e, ""))
			for _, verb := range []struct {
				command string
				ns      netns
			}{{"ADD", other}, {"CHECK", live}, {"DEL", live}} {
				r := runPlugin(t, e.binary(pluginType), e.cniArgs(verb.command, verb.ns), runOpts{stdin: entry, timeout: plantedBound})
				ce := assertCNIFailure(t, r, codeIOFailure)
				if !strings.Contains(ce.Msg+ce.Details, planted) || !strings.Contains(ce.Msg+ce.Details, tc.says) {
					t.Errorf("%s: %q (%q), want it to name %s as %s", verb.command, ce.Msg, ce.Details, planted, tc.says)
				}
				if r.elapsed > plantedBound/2 {
					t.Errorf("%s took %v", verb.command, r.elapsed)
				}
			}
			for _, args := range [][]string{
				{"leases", "--data-dir", e.dataDir},
				{"leases", "--json", "--data-dir", e.dataDir},
				{"gc", "--dry-run", "--data-dir", e.dataDir},
				{"gc", "--data-dir", e.dataDir},
			} {
				r := runPlugin(t, e.binary(pluginType), invoke.Args{}, runOpts{argv: args, timeout: plantedBound})
				t.Logf("%s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.err, truncateText(r.stdout, 600), truncateText(r.stderr, 600))
				if r.elapsed > plantedBound/2 {
					t.Errorf("%s took %v", strings.Join(args, " "), r.elapsed)
				}
				if !strings.Contains(r.stdout+r.stderr, tc.says) && !strings.Contains(r.stdout+r.stderr, "not a regular file") {
					t.Errorf("%s does not say what it skipped", strings.Join(args, " "))
				}
			}
			if entries, _ := os.ReadDir(outside); len(entries) != 0 {
				t.Errorf("created through the planted link: %v", entries)
			}

			if err := os.Remove(planted); err != nil {
				t.Fatal(err)
			}
			e.mustCNI(t, "check", live, "")
			e.mustCNI(t, "del", live, "")
			e.assertNetworkEmpty(t, e.leaseDir())
		})
	}
}

func mkfifo(t *testing.T, path string) string {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatalf("mkfifo %s: %v", path, err)
	}
	return path
}
