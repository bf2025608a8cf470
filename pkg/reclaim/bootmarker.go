package reclaim

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netdir"
)

// Boot markers sit in a network's record directory and hold the boot ID of
// the last time something that is done once per boot and network was done.
// The ID, not the file's existence, decides: a dataDir that is not a tmpfs
// keeps its markers across reboots. Names starting with '.' are not
// records.
const (
	// migratedMarker: legacy leases were migrated.
	migratedMarker = ".migrated"
	// notTmpfsWarnedMarker: the warning that dataDir is not on tmpfs was
	// given.
	notTmpfsWarnedMarker = ".warned-not-tmpfs"
)

// bootMarker is one marker file of one network.
type bootMarker struct {
	recDir, path string
}

func newBootMarker(d netdir.Dir, name string) bootMarker {
	recDir := d.Records()
	return bootMarker{recDir: recDir, path: filepath.Join(recDir, name)}
}

// current reports whether the marker was written in the boot bootID. A
// missing or unreadable marker is not current: the work is done again.
func (m bootMarker) current(bootID string) bool {
	b, err := statefile.ReadFileNoFollow(m.path)
	return err == nil && string(b) == bootID
}

// set records bootID in the marker, atomically.
func (m bootMarker) set(bootID string) error {
	if err := os.MkdirAll(m.recDir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", m.recDir, err)
	}
	if err := statefile.WriteFileAtomic(m.path, []byte(bootID)); err != nil {
		return fmt.Errorf("write %s: %w", m.path, err)
	}
	return nil
}

// ClaimNotTmpfsWarning reports whether the warning that dataDir is not on
// tmpfs is still due in this boot for d.Network, and records that it is
// being given, so that a runtime's log gets it once per boot and network
// rather than on every ADD. When the marker cannot be read or written it
// says the warning is due (better repeated than lost) and returns why.
func (s *Sweeper) ClaimNotTmpfsWarning(d netdir.Dir) (bool, error) {
	bootID, err := s.Host.BootID()
	if err != nil {
		return true, err
	}
	m := newBootMarker(d, notTmpfsWarnedMarker)
	if m.current(bootID) {
		return false, nil
	}
	if err := m.set(bootID); err != nil {
		return true, fmt.Errorf("record that the tmpfs warning was given: %w", err)
	}
	return true, nil
}
