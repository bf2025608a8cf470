package e2e

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// TestBadConfigTouchesNothing runs the plugin binary directly, as a runtime
// would (CNI_* environment, config on stdin), with configs it must reject.
// Each must produce a CNI error object with a code on stdout and a non-zero
// exit, and leave no trace: nothing in dataDir or the working directory, no
// bridge, no interface in the namespace, no lease anywhere. The exact codes
// are the unit tests' business; codes the contract pins are checked here.
func TestBadConfigTouchesNothing(t *testing.T) {
	// valid is the minimal example's plugin entry as a runtime hands it to
	// the plugin: a single config with name and cniVersion.
	valid := func(t *testing.T, e *testEnv) map[string]any {
		t.Helper()
		conf := e.confFor(t, "minimal.conflist")
		entry := entryOfType(t, conf, pluginType)
		entry["name"] = e.netName
		entry["cniVersion"] = conf["cniVersion"]
		return entry
	}
	for _, tc := range []struct {
		name     string
		stdin    func(t *testing.T, e *testEnv) []byte
		wantCode int // 0: any non-zero code
	}{
		{name: "malformed-json", stdin: func(t *testing.T, e *testEnv) []byte {
			raw := mustJSON(t, valid(t, e))
			return raw[:len(raw)/2]
		}},
		{name: "missing-ipam", stdin: func(t *testing.T, e *testEnv) []byte {
			c := valid(t, e)
			delete(c, "ipam")
			return mustJSON(t, c)
		}},
		{name: "ipam-not-host-local", wantCode: 7, stdin: func(t *testing.T, e *testEnv) []byte {
			c := valid(t, e)
			c["ipam"] = map[string]any{"type": "static", "addresses": []any{map[string]any{"address": e.subnet4.Addr().Next().String() + "/24"}}}
			return mustJSON(t, c)
		}},
		{name: "relative-dataDir", stdin: func(t *testing.T, e *testEnv) []byte {
			c := valid(t, e)
			c["dataDir"] = "relative/leases"
			return mustJSON(t, c)
		}},
		{name: "delegate-with-slash", stdin: func(t *testing.T, e *testEnv) []byte {
			c := valid(t, e)
			c["delegate"] = "../bin/bridge"
			return mustJSON(t, c)
		}},
		{name: "delegate-not-in-CNI_PATH", stdin: func(t *testing.T, e *testEnv) []byte {
			c := valid(t, e)
			c["delegate"] = "nonexistent-plugin"
			return mustJSON(t, c)
		}},
		{name: "unsupported-cniVersion", wantCode: 1, stdin: func(t *testing.T, e *testEnv) []byte {
			c := valid(t, e)
			c["cniVersion"] = "0.2.0"
			return mustJSON(t, c)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A fresh environment per case, so that whatever one case
			// wrongly creates cannot be blamed on the next.
			e := newEnv(t)
			e.requirePlugin(t)
			ns := e.addNetns(t, "a")
			cwd := t.TempDir() // a relative dataDir would land here
			r := cniexec.Run(t, e.binary(pluginType), e.cniArgs("ADD", ns), cniexec.Opts{Stdin: tc.stdin(t, e), Dir: cwd})
			var exitErr *exec.ExitError
			if !errors.As(r.Err, &exitErr) {
				t.Fatalf("want a non-zero exit, got %v", r)
			}
			ce, err := parseCNIError(r.Stdout)
			if err != nil || ce.code() == 0 {
				t.Fatalf("stdout is not a CNI error object with a code and a msg: %v\n%s", err, r)
			}
			if tc.wantCode != 0 && ce.code() != tc.wantCode {
				t.Errorf("code %d, want %d: %s", ce.code(), tc.wantCode, r.Stdout)
			}
			t.Logf("rejected with code %d: %s", ce.code(), ce.Msg)

			assertEmptyDir(t, e.dataDir)
			assertEmptyDir(t, cwd)
			e.assertDefaultDirsUntouched(t)
			if linkExists(e.bridge) {
				t.Errorf("bridge %s was created for a rejected config", e.bridge)
			}
			if linkExistsIn(ns, ifName) {
				t.Errorf("%s was created in %s for a rejected config", ifName, ns.name)
			}
		})
	}
}

// TestFingerprint runs the binary with no CNI_COMMAND and no arguments, as
// Nomad does with every executable in cni_path: it must print a line with a
// semver and exit 0, or Nomad cannot place bridge-mode jobs.
func TestFingerprint(t *testing.T) {
	bin := testhost.BinDir(t)
	testhost.RequireBinaries(t, bin, pluginType)
	r := cniexec.Run(t, filepath.Join(bin, pluginType), invoke.Args{}, cniexec.Opts{})
	if r.Err != nil {
		t.Fatalf("run without arguments: %v", r.Err)
	}
	first, _, _ := strings.Cut(r.Stdout, "\n")
	re := regexp.MustCompile(`^CNI nomad-bridge-cni plugin v\d+\.\d+\.\d+\S*$`)
	if !re.MatchString(first) {
		t.Fatalf("fingerprint line %q does not match %s", first, re)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return raw
}

// assertEmptyDir fails if dir holds anything (a missing dir is empty).
func assertEmptyDir(t *testing.T, dir string) {
	t.Helper()
	var found []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			found = append(found, p)
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("walk %s: %v", dir, err)
	}
	if len(found) > 0 {
		t.Errorf("rejected config left files behind: %v", found)
	}
}
