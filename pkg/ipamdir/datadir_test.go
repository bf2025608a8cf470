package ipamdir

import (
	"os"
	"path/filepath"
	"testing"
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
	if err := c.CheckUsable(); err != nil {
		t.Fatalf("CheckUsable on a creatable dir: %v", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 0 {
		t.Errorf("probe left behind: %v %v", entries, err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := (Dir{DataDir: file, Network: "net"}).CheckUsable(); err == nil {
		t.Errorf("CheckUsable accepted a regular file as dataDir")
	}
}
