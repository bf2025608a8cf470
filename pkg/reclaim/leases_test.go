package reclaim

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// holds answers from one listing of the directory: it must say what an
// fstatat of each name would, and forget what remove took.
func TestLeaseDirHoldsOnlyRegularFilesNamedAsHostLocalDoes(t *testing.T) {
	dir := t.TempDir()
	write := func(name string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("c1\r\neth0"), 0o644); err != nil {
			t.Fatal(err)
		}
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
	// each says the same before and after holds listed the directory.
	eachOf := func(d *leaseDir) (listed []string, bad int) {
		if err := d.each(nil, func(l Lease) { listed = append(listed, l.IP.String()) }, func(error) { bad++ }); err != nil {
			t.Fatal(err)
		}
		return listed, bad
	}
	d, err := openLeaseDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	before, badBefore := eachOf(d)
	for ip, want := range map[string]bool{
		"10.0.0.2": true, "fd00::2": true, "10.0.0.3": false, "10.0.0.4": false, "10.0.0.5": false, "10.0.0.6": false,
	} {
		path, got := d.holds(net.ParseIP(ip))
		if got != want {
			t.Errorf("holds(%s) = %v, want %v", ip, got, want)
		}
		if got && path != filepath.Join(dir, ip) {
			t.Errorf("holds(%s) gives path %s, want %s", ip, path, filepath.Join(dir, ip))
		}
	}

	after, badAfter := eachOf(d)
	if len(before) != 3 || badBefore != 2 || !slices.Equal(before, after) || badAfter != badBefore {
		t.Errorf("each: %v and %d bad, after holds: %v and %d bad; want the three regular files and the symlink and directory as bad", before, badBefore, after, badAfter)
	}

	// A lease whose name only parses as an address is not the one named
	// after it: removing it keeps 10.0.0.3 out and fd00::2 in.
	odd, err := readLease(filepath.Join(dir, "::ffff:10.0.0.3"))
	if err != nil {
		t.Fatal(err)
	}
	odd.IP = net.ParseIP("10.0.0.3")
	write("10.0.0.3")
	d2, err := openLeaseDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.close()
	if _, ok := d2.holds(odd.IP); !ok {
		t.Fatal("holds(10.0.0.3) = false with the file there")
	}
	if err := d2.remove([]Lease{odd}); err != nil {
		t.Fatal(err)
	}
	if _, ok := d2.holds(odd.IP); !ok {
		t.Error("removing ::ffff:10.0.0.3 made holds(10.0.0.3) false")
	}

	l, err := d.read(net.ParseIP("10.0.0.2"))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.remove([]Lease{l}); err != nil {
		t.Fatal(err)
	}
	if _, ok := d.holds(net.ParseIP("10.0.0.2")); ok {
		t.Error("holds(10.0.0.2) after its removal = true")
	}
}
