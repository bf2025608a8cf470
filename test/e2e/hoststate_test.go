package e2e

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// hostState is what a run must not change: directory trees (every entry
// with its type, mode, owner, size, mtime and content hash or link target),
// the entries of the shared default directories, and the links and the
// nat and filter tables of both families of the namespace the plugin ran
// in. Other test runs may share the host, so in the host's own namespace
// only the lines that name something of the test (its footprint) count.
type hostState map[string]string

// stateScope says where a snapshot looks. pluginNS is the namespace the
// plugin runs in (its "host"; every line counts there), footprint the
// strings that mark the test's own lines in the real host namespace.
type stateScope struct {
	pluginNS  string
	footprint []string
	trees     []string
}

// takeHostState snapshots what scope names.
func takeHostState(t *testing.T, scope stateScope) hostState {
	t.Helper()
	s := hostState{}
	for _, root := range scope.trees {
		s["tree "+root] = treeState(t, root)
	}
	for _, d := range []string{hostLocalDefaultDir, pluginDefaultDataDir} {
		s["entries "+d] = dirEntries(t, d)
	}
	if scope.pluginNS != "" {
		for k, v := range netState(t, scope.pluginNS) {
			s["plugin netns: "+k] = v
		}
	}
	if len(scope.footprint) > 0 {
		for k, v := range netState(t, "") {
			var mine []string
			for line := range strings.SplitSeq(v, "\n") {
				if slices.ContainsFunc(scope.footprint, func(f string) bool { return strings.Contains(line, f) }) {
					mine = append(mine, line)
				}
			}
			s["host netns (test's lines): "+k] = strings.Join(mine, "\n")
		}
	}
	return s
}

// netState is the link list and the nat and filter tables of both
// families in the namespace at nsPath ("" for the test's own).
func netState(t *testing.T, nsPath string) map[string]string {
	t.Helper()
	in := func(name string, args ...string) string {
		if nsPath != "" {
			args = append([]string{"--net=" + nsPath, "--", name}, args...)
			name = "nsenter"
		}
		out, err := output(name, args...)
		if err != nil {
			t.Fatalf("%v", err)
		}
		return out
	}
	s := map[string]string{}
	var names []string
	for line := range strings.SplitSeq(in("ip", "-o", "link", "show"), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			names = append(names, f[1])
		}
	}
	s["links"] = strings.Join(names, "\n")
	for _, fam := range ipFamilies {
		for _, table := range []string{"nat", "filter"} {
			s[fam+" -t "+table] = in(fam, "-w", "-t", table, "-S")
		}
	}
	return s
}

// assertUnchanged reports every part of the host state that differs from
// before, with a line diff.
func (before hostState) assertUnchanged(t *testing.T, after hostState) {
	t.Helper()
	keys := make([]string, 0, len(before))
	for k := range before {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if before[k] != after[k] {
			t.Errorf("%s changed:\n%s", k, lineDiff(before[k], after[k]))
		}
	}
}

// lineDiff lists the lines only in a (-) and only in b (+).
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out strings.Builder
	for _, l := range al {
		if !slices.Contains(bl, l) {
			out.WriteString("  - " + l + "\n")
		}
	}
	for _, l := range bl {
		if !slices.Contains(al, l) {
			out.WriteString("  + " + l + "\n")
		}
	}
	return out.String()
}

// treeState describes every entry under root without following symlinks.
func treeState(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		b.WriteString(entryState(t, p) + "\n")
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return "(absent)"
	}
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return b.String()
}

// entryState is one line describing path (not following a symlink).
func entryState(t *testing.T, p string) string {
	t.Helper()
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return p + " (absent)"
	}
	if err != nil {
		t.Fatalf("lstat %s: %v", p, err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	line := fmt.Sprintf("%s %v uid=%d gid=%d size=%d mtime=%d", p, fi.Mode(), st.Uid, st.Gid, fi.Size(), fi.ModTime().UnixNano())
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(p)
		if err != nil {
			t.Fatalf("readlink %s: %v", p, err)
		}
		line += " -> " + target
	case fi.Mode().IsRegular():
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		line += fmt.Sprintf(" sha256=%x", sha256.Sum256(raw))
	}
	return line
}

// dirEntries lists the names in dir, or "(absent)".
func dirEntries(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return "(absent)"
	}
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return strings.Join(names, "\n")
}
