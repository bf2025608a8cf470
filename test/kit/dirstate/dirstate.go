// Package dirstate describes a directory tree for before/after comparisons
// in tests: every entry's path, mode, mtime and, for regular files, content,
// without following symlinks.
package dirstate

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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
