package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/dirstate"
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
// (code 5, naming the file), except a DEL beside a planted lease, which
// succeeds without running host-local on the directory (the plugin
// releases the leases) and leaves the planted file where it is; `leases`
// and `gc` finish and say why they skipped it, nothing is created through
// the link, and once the file is gone everything works again.
func TestPlantedFilesNeverHang(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, e *testEnv, outside string) string
		says  string
		// delWorks: DEL succeeds beside the planted file.
		delWorks bool
	}{
		{"fifo-lock", func(t *testing.T, e *testEnv, _ string) string {
			p := filepath.Join(e.leaseDir(), "lock")
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			return dirstate.PlantFIFO(t, p)
		}, "FIFO", false},
		{"fifo-lease", func(t *testing.T, e *testEnv, _ string) string {
			return dirstate.PlantFIFO(t, filepath.Join(e.leaseDir(), e.hostAddr(200).String()))
		}, "FIFO", true},
		{"symlinked-lock", func(t *testing.T, e *testEnv, outside string) string {
			p := filepath.Join(e.leaseDir(), "lock")
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(outside, "created-through-the-link"), p); err != nil {
				t.Fatal(err)
			}
			return p
		}, "symlink", false},
		// Regression: ADD wrote the address it handed out through a
		// planted last_reserved_ip.0 link, out of the data dir.
		{"symlinked-last-reserved", func(t *testing.T, e *testEnv, outside string) string {
			p := filepath.Join(e.leaseDir(), "last_reserved_ip.0")
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(outside, "written-through-the-link"), p); err != nil {
				t.Fatal(err)
			}
			return p
		}, "symlink", true},
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
				r := cniexec.Run(t, e.binary(pluginType), e.cniArgs(verb.command, verb.ns), cniexec.Opts{Stdin: entry, Timeout: plantedBound})
				if verb.command == "DEL" && tc.delWorks {
					if r.Err != nil || r.Elapsed > plantedBound/2 {
						t.Errorf("DEL beside a planted lease: %v", r)
					}
					// Not assertNoTrace: it reads every lease, the FIFO too.
					e.assertNoRecord(t, live.cid)
					assertNoRegularLeaseOf(t, e.leaseDir(), live.cid)
					e.assertNAT(t, live.cid, natWant{})
					if _, err := os.Lstat(planted); err != nil {
						t.Errorf("the DEL moved or removed the planted file: %v", err)
					}
					continue
				}
				ce := assertCNIFailure(t, r, codeIOFailure)
				if !strings.Contains(ce.Msg+ce.Details, planted) || !strings.Contains(ce.Msg+ce.Details, tc.says) {
					t.Errorf("%s: %q (%q), want it to name %s as %s", verb.command, ce.Msg, ce.Details, planted, tc.says)
				}
				if r.Elapsed > plantedBound/2 {
					t.Errorf("%s took %v", verb.command, r.Elapsed)
				}
			}
			for _, args := range [][]string{
				{"leases", "--data-dir", e.dataDir},
				{"leases", "--json", "--data-dir", e.dataDir},
				{"gc", "--dry-run", "--data-dir", e.dataDir},
				{"gc", "--data-dir", e.dataDir},
			} {
				r := cniexec.Run(t, e.binary(pluginType), invoke.Args{}, cniexec.Opts{Argv: args, Timeout: plantedBound})
				t.Logf("%s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.Err, truncateText(r.Stdout, 600), truncateText(r.Stderr, 600))
				if r.Elapsed > plantedBound/2 {
					t.Errorf("%s took %v", strings.Join(args, " "), r.Elapsed)
				}
				if !strings.Contains(r.Stdout+r.Stderr, tc.says) && !strings.Contains(r.Stdout+r.Stderr, "not a regular file") {
					t.Errorf("%s does not say what it skipped", strings.Join(args, " "))
				}
			}
			if entries, _ := os.ReadDir(outside); len(entries) != 0 {
				t.Errorf("created through the planted link: %v", entries)
			}

			if err := os.Remove(planted); err != nil {
				t.Fatal(err)
			}
			if !tc.delWorks {
				e.mustCNI(t, "check", live, "")
				e.mustCNI(t, "del", live, "")
			}
			e.assertNetworkEmpty(t, e.leaseDir())
		})
	}
}

// assertNoRegularLeaseOf fails if a regular file in dir names cid; it
// opens nothing else (a planted FIFO would block the read).
func assertNoRegularLeaseOf(t *testing.T, dir, cid string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err == nil && strings.TrimSpace(string(b)) == leaseContent(cid) {
			t.Errorf("lease %s of %s is still there", e.Name(), cid)
		}
	}
}

// TestFIFOAsCNINetns: regression test. CNI_NETNS naming a FIFO hung ADD
// (the path was opened before the nsfs check) and DEL after its work
// (skel's own-namespace check opens it). Now ADD refuses it at once as no
// namespace (code 8), and DEL, with nothing of the container here, is a
// success; neither opens it.
func TestFIFOAsCNINetns(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	e.writeConflist(t, e.reclaimConf(t, "minimal.conflist"))
	ns := e.addNetns(t, "fifo")
	fifo := dirstate.PlantFIFO(t, filepath.Join(t.TempDir(), "netns"))
	entry := mustJSON(t, hostileEntry(t, e, ""))
	for _, command := range []string{"ADD", "CHECK", "DEL"} {
		args := e.cniArgs(command, ns)
		args.NetNS = fifo
		r := cniexec.Run(t, e.binary(pluginType), args, cniexec.Opts{Stdin: entry, Timeout: plantedBound})
		if r.Elapsed > plantedBound/2 {
			t.Fatalf("%s with a FIFO as CNI_NETNS took %v: %v", command, r.Elapsed, r)
		}
		switch command {
		case "DEL":
			if r.Err != nil {
				t.Errorf("DEL with a FIFO as CNI_NETNS and nothing to delete: %v", r)
			}
		case "ADD":
			assertCNIFailure(t, r, codeInvalidNetNS)
		default:
			// bridge's CHECK says it is no namespace, in its own words.
			if r.Err == nil {
				t.Errorf("CHECK with a FIFO as CNI_NETNS succeeded: %v", r)
			}
		}
	}
	e.assertNoTrace(t, ns.cid)
}

// TestDelBesideAPlantedLeaseRunsHostLocalOnNothingPlanted: regression
// test. A DEL beside a planted lease runs host-local on a scratch
// directory instead of the network's; that directory was
// .nomad-bridge-cni/.scratch-ipam in the data dir, checked by nothing: a
// symlink planted there made host-local create its directory and lock
// through it, out of the data dir, and a FIFO planted as its lock hung
// the DEL until delegateTimeout. Now each DEL gets an empty directory of
// its own, and succeeds at once.
func TestDelBesideAPlantedLeaseRunsHostLocalOnNothingPlanted(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, e *testEnv, outside string)
	}{
		{"symlinked-scratch", func(t *testing.T, e *testEnv, outside string) {
			if err := os.Symlink(outside, filepath.Join(e.stateDir, recordDirName, ".scratch-ipam")); err != nil {
				t.Fatal(err)
			}
		}},
		{"fifo-as-scratch-lock", func(t *testing.T, e *testEnv, _ string) {
			dirstate.PlantFIFO(t, filepath.Join(e.stateDir, recordDirName, ".scratch-ipam", e.netName, "lock"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			e.writeConflist(t, e.reclaimConf(t, "minimal.conflist"))
			live := e.addNetns(t, "live")
			e.mustCNI(t, "add", live, "")
			lease := dirstate.PlantFIFO(t, filepath.Join(e.leaseDir(), e.hostAddr(200).String()))
			outside := t.TempDir()
			tc.plant(t, e, outside)

			entry := mustJSON(t, hostileEntry(t, e, ""))
			r := cniexec.Run(t, e.binary(pluginType), e.cniArgs("DEL", live), cniexec.Opts{Stdin: entry, Timeout: plantedBound})
			if r.Err != nil || r.Elapsed > plantedBound/2 {
				t.Errorf("DEL beside a planted lease: %v", r)
			}
			if entries, _ := os.ReadDir(outside); len(entries) != 0 {
				t.Errorf("host-local created through the planted link: %v", entries)
			}
			e.assertNoRecord(t, live.cid)
			assertNoRegularLeaseOf(t, e.leaseDir(), live.cid)
			if err := os.Remove(lease); err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(filepath.Join(e.stateDir, recordDirName, ".scratch-ipam")); err != nil {
				t.Fatal(err)
			}
			e.assertNetworkEmpty(t, e.leaseDir())
		})
	}
}
