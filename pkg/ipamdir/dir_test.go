package ipamdir

import (
	"os"
	"path/filepath"
	"testing"
)

func TestLayout(t *testing.T) {
	d := New("/run/cni", "nomad")
	if d.Leases() != "/run/cni/nomad" || d.Records() != "/run/cni/.nomad-bridge-cni/nomad" {
		t.Errorf("layout = %s, %s", d.Leases(), d.Records())
	}
}

func TestListFindsLeaseAndRecordDirectories(t *testing.T) {
	data := t.TempDir()
	for _, dir := range []string{"a", RecordDirName + "/b", RecordDirName + "/a", "bad name", ".hidden"} {
		if err := os.MkdirAll(filepath.Join(data, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dirs, _, err := List(data, "")
	if err != nil || len(dirs) != 2 || dirs[0].Network != "a" || dirs[1].Network != "b" {
		t.Fatalf("List = %+v, %v", dirs, err)
	}
	if dirs, _, err := List(data, "b"); err != nil || len(dirs) != 1 {
		t.Errorf("List(b) = %+v, %v", dirs, err)
	}
	if err := os.Symlink(t.TempDir(), filepath.Join(data, "c")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := List(data, "c"); err == nil {
		t.Error("a symlinked network directory was listed")
	}
}
