package testhost

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
)

// DirOffTmpfs is a directory on a filesystem that is not tmpfs, for tests
// of what the plugin does only off tmpfs: t.TempDir() where that is not
// tmpfs (Debian 12), else a small ext4 the test loop-mounts there and
// unmounts at its end (Debian 13 mounts /tmp as a tmpfs, and a new user
// often clones there). It needs root and mkfs.ext4 then: without them the
// test skips, or fails in CI.
func DirOffTmpfs(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if !statefile.InMemory(st.Type) {
		return dir
	}
	if missing := MissingTools("mkfs.ext4", "mount", "umount"); len(missing) > 0 {
		SkipOrFail(t, dir+" is on tmpfs, and a filesystem off it cannot be made here: missing "+strings.Join(missing, ", "))
	}
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 16<<20); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]string{{"mkfs.ext4", "-q", "-F", img}, {"mount", "-o", "loop", img, mnt}} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", cmd, err, out)
		}
	}
	// Registered after t.TempDir's removal, so it runs before it.
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	return mnt
}
