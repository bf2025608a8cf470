package reclaim

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// each lists only the regular files named as host-local names leases,
// reporting the rest; remove takes only the file that was read.
func TestLeaseDirListsAndRemovesOnlyRegularFilesNamedAsHostLocalDoes(t *testing.T) {
	dir := t.TempDir()
	write := func(name string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("c1\r\neth0"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	there := func(name string) bool {
		_, err := os.Lstat(filepath.Join(dir, name))
		return err == nil
	}
	write("10.0.0.2")
	write("fd00::2")
	write("::ffff:10.0.0.3") // the same 16 bytes as 10.0.0.3, not its name
	if err := os.Symlink("10.0.0.2", filepath.Join(dir, "10.0.0.4")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "10.0.0.5"), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := openLeaseDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	var listed []string
	bad := 0
	if err := d.each(nil, func(l Lease) { listed = append(listed, l.IP.String()) }, func(error) { bad++ }); err != nil {
		t.Fatal(err)
	}
	if len(listed) != 3 || bad != 2 {
		t.Errorf("each: %v and %d bad; want the three regular files, and the symlink and directory as bad", listed, bad)
	}

	// A lease whose name only parses as an address is not the one named
	// after it: removing it keeps 10.0.0.3.
	odd, err := readLease(filepath.Join(dir, "::ffff:10.0.0.3"))
	if err != nil {
		t.Fatal(err)
	}
	odd.IP = net.ParseIP("10.0.0.3")
	write("10.0.0.3")
	if err := d.remove([]Lease{odd}); err != nil {
		t.Fatal(err)
	}
	if !there("10.0.0.3") || there("::ffff:10.0.0.3") {
		t.Errorf("removing ::ffff:10.0.0.3: 10.0.0.3 there %v, ::ffff:10.0.0.3 there %v", there("10.0.0.3"), there("::ffff:10.0.0.3"))
	}

	l, err := d.read(net.ParseIP("10.0.0.2"))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.remove([]Lease{l}); err != nil {
		t.Fatal(err)
	}
	if there("10.0.0.2") || !there("fd00::2") {
		t.Error("remove of 10.0.0.2 left it, or took fd00::2")
	}
}
