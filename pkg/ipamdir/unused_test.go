package ipamdir

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
)

// What a failed verb created on a new network goes, lock and OwnedMarker
// included; a directory that holds a lease, a record or a record being
// written is someone's, and stays whole.
func TestRemoveUnused(t *testing.T) {
	write := func(t *testing.T, path string) {
		t.Helper()
		mustOK(t, os.MkdirAll(filepath.Dir(path), 0o755))
		mustOK(t, os.WriteFile(path, nil, 0o600))
	}
	t.Run("only what the verb made", func(t *testing.T) {
		d := New(filepath.Join(t.TempDir(), "data"), "net")
		was := d.Existing()
		write(t, filepath.Join(d.Leases(), LockFileName))
		write(t, filepath.Join(d.Leases(), lastReservedPrefix+"0"))
		write(t, d.Marker(OwnedMarker))
		write(t, d.Marker(MigratedMarker))
		mustOK(t, d.RemoveUnused(was))
		if statefile.Exists(d.DataDir) {
			t.Errorf("left %s", d.DataDir)
		}
	})
	for name, keep := range map[string]func(Dir) string{
		"lease":  func(d Dir) string { return filepath.Join(d.Leases(), "10.0.0.2") },
		"record": func(d Dir) string { return filepath.Join(d.Records(), RecordName("c1", "eth0")) },
		"temp":   func(d Dir) string { return filepath.Join(d.Records(), ".tmp-1-x") },
	} {
		t.Run(name, func(t *testing.T) {
			d := New(filepath.Join(t.TempDir(), "data"), "net")
			was := d.Existing()
			write(t, filepath.Join(d.Leases(), LockFileName))
			write(t, d.Marker(OwnedMarker))
			write(t, keep(d))
			mustOK(t, d.RemoveUnused(was))
			dir := filepath.Dir(keep(d))
			lock := filepath.Join(d.Leases(), LockFileName)
			if dir == d.Records() {
				lock = d.Marker(OwnedMarker)
			}
			if !statefile.Exists(keep(d)) || !statefile.Exists(lock) {
				t.Errorf("removed from %s, which holds %s", dir, keep(d))
			}
		})
	}
}
