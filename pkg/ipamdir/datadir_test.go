package ipamdir

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

func TestOnTmpfsRecognisesOtherFilesystems(t *testing.T) {
	// /proc is procfs on every Linux host: a filesystem that is certainly
	// not tmpfs, without needing root to mount one.
	c := Dir{DataDir: "/proc"}
	onTmpfs, magic, err := c.OnTmpfs()
	if err != nil {
		t.Fatal(err)
	}
	if onTmpfs || magic == 0 {
		t.Errorf("OnTmpfs(/proc) = %v, 0x%x; want false and procfs' magic", onTmpfs, magic)
	}
}

func TestCheckUsable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	c := Dir{DataDir: dir, Network: "net"}
	if problem, err := c.CheckUsable(); err != nil || problem != "" {
		t.Fatalf("CheckUsable on a creatable dir: %q, %v", problem, err)
	}
	if _, err := os.Stat(filepath.Dir(dir)); !os.IsNotExist(err) {
		t.Errorf("CheckUsable created something: %v", err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (Dir{DataDir: file, Network: "net"}).CheckUsable(); err == nil {
		t.Errorf("CheckUsable accepted a regular file as dataDir")
	}
	// A read-only filesystem is a problem an ADD fails on, not an error.
	if problem, err := (Dir{DataDir: "/proc/sys/fs/nbc", Network: "net"}).CheckUsable(); err != nil || problem == "" {
		t.Errorf("CheckUsable under /proc/sys = %q, %v; want a problem, no error", problem, err)
	}
}

// A filesystem that counts no inodes (tmpfs with nr_inodes=0, btrfs)
// reports none free, and allocates them as it goes: it is not full, and
// STATUS must not tell the operator that an ADD will fail there.
func TestCheckUsableOnAFilesystemWithoutAnInodeCount(t *testing.T) {
	if os.Geteuid() != 0 {
		testhost.SkipOrFail(t, "mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "nr_inodes=0,size=1m"); err != nil {
		t.Fatalf("mount tmpfs with nr_inodes=0 on %s: %v", dir, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if problem, err := (Dir{DataDir: dir, Network: "net"}).CheckUsable(); err != nil || problem != "" {
		t.Errorf("CheckUsable on a tmpfs with unlimited inodes = %q, %v; want no problem", problem, err)
	}
}
