package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// A file just written is in the page cache; evictBinaries must leave none
// of it there, or the cold-start table measures a state no node has after
// a boot.
func TestEvictBinariesDropsTheirPages(t *testing.T) {
	// tmpfs keeps its files in the page cache: nothing to evict to.
	dir := testhost.DirOffTmpfs(t)
	bin := filepath.Join(dir, "bridge")
	if err := os.WriteFile(bin, bytes.Repeat([]byte("x"), 1<<20), 0o755); err != nil {
		t.Fatal(err)
	}
	extra := filepath.Join(testhost.DirOffTmpfs(t), "floor")
	if err := os.WriteFile(extra, bytes.Repeat([]byte("y"), 64<<10), 0o755); err != nil {
		t.Fatal(err)
	}
	if r, n, err := residentPages(bin); err != nil || r != n || n != (1<<20)/os.Getpagesize() {
		t.Fatalf("before: %d of %d pages resident (%v), want all of a fresh file", r, n, err)
	}
	note, err := evictBinaries(dir, "", extra)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{bin, extra} {
		if r, n, err := residentPages(p); err != nil || r != 0 {
			t.Errorf("after: %d of %d pages of %s resident (%v), want none", r, n, p, err)
		}
	}
	if !strings.Contains(note, "the 2 binaries") || strings.Contains(note, "still resident") {
		t.Errorf("note %q", note)
	}
}
