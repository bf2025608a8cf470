// Package dirstate describes a directory tree for before/after comparisons
// in tests: every entry's path, mode, mtime and, for regular files, content,
// without following symlinks. It also plants the FIFOs tests put in one.
package dirstate

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Describe returns one line per entry under root, in lexical order.
func Describe(root string) (string, error) {
	var b strings.Builder
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		content := ""
		if fi.Mode().IsRegular() {
			c, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			content = string(c)
		}
		b.WriteString(path + " " + fi.Mode().String() + " " + fi.ModTime().String() + " " + content + "\n")
		return nil
	})
	return b.String(), err
}

// PlantFIFO makes a FIFO at path, and the directories above it, and
// returns path. When the test ends it opens the FIFO for writing without
// blocking: that lets go whatever still waits in open(2) to read it, which
// a test that failed (the code did block) would otherwise leave hanging.
func PlantFIFO(t testing.TB, path string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatalf("mkfifo %s: %v", path, err)
	}
	t.Cleanup(func() {
		if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
	return path
}
