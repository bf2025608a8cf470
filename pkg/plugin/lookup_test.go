package plugin

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// installedAs makes dir/name this test binary (a symlink: the same file),
// as `make install-as-bridge` puts the plugin in front of bridge.
func installedAs(t *testing.T, dir, name string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.Symlink(self, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func executable(t *testing.T, dir, name string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestFindDelegateSkipsItself(t *testing.T) {
	ours, ref, empty := t.TempDir(), t.TempDir(), t.TempDir()
	installedAs(t, ours, "bridge")
	real := executable(t, ref, "bridge")

	got, err := FindDelegate("bridge", []string{empty, ours, ref})
	if err != nil || got != real {
		t.Errorf("FindDelegate past itself = %q, %v; want %q", got, err, real)
	}
	// Listed first, the reference bridge is found first.
	if got, err := FindDelegate("bridge", []string{ref, ours}); err != nil || got != real {
		t.Errorf("FindDelegate = %q, %v; want %q", got, err, real)
	}
	// Nothing but itself: a loop, said as such.
	if _, err := FindDelegate("bridge", []string{ours, empty}); !errors.Is(err, ErrOnlySelf) {
		t.Errorf("FindDelegate with only itself = %v, want ErrOnlySelf", err)
	}
	if _, err := FindDelegate("bridge", []string{empty}); err == nil || errors.Is(err, ErrOnlySelf) {
		t.Errorf("FindDelegate with nothing = %v, want not found", err)
	}
	for _, bad := range []string{"", "a/b"} {
		if _, err := FindDelegate(bad, []string{ref}); err == nil {
			t.Errorf("FindDelegate(%q) accepted", bad)
		}
	}
}

func TestLoopIsAConfigError(t *testing.T) {
	ours := t.TempDir()
	installedAs(t, ours, "bridge")
	t.Setenv("CNI_PATH", ours)
	p := &Plugin{Exec: &delegateExec{}}
	err := p.find("bridge")
	var cniErr *types.Error
	if !errors.As(err, &cniErr) || cniErr.Code != types.ErrInvalidNetworkConfig || !strings.Contains(cniErr.Msg, `"delegate" "bridge" names this plugin itself`) {
		t.Errorf("find with only itself in CNI_PATH = %v", err)
	}
}
