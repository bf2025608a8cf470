package reclaim

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
)

// Boot markers (ipamdir.Marker) hold the boot ID of the last time something
// that is done once per boot and network was done. The ID, not the file's
// existence, decides: a dataDir that is not a tmpfs keeps its markers
// across reboots.

// bootMarker is one marker file of one network.
type bootMarker struct {
	recDir, path string
}

func newBootMarker(d ipamdir.Dir, m ipamdir.Marker) bootMarker {
	return bootMarker{recDir: d.Records(), path: d.Marker(m)}
}

// current reports whether the marker was written in the boot bootID. A
// missing or unreadable marker is not current: the work is done again.
func (m bootMarker) current(bootID string) bool {
	b, err := statefile.ReadFileNoFollow(m.path)
	return err == nil && string(b) == bootID
}

// set records bootID in the marker, atomically.
func (m bootMarker) set(bootID string) error { return m.write([]byte(bootID)) }

// write replaces the marker's content, atomically.
func (m bootMarker) write(b []byte) error {
	if err := os.MkdirAll(m.recDir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", m.recDir, err)
	}
	if err := statefile.WriteAtomic(m.path, b, nil); err != nil {
		return fmt.Errorf("write %s: %w", m.path, err)
	}
	return nil
}

// owns reports whether the network in d is proved the plugin's
// (ipamdir.OwnedMarker is a regular file, not followed).
func owns(d ipamdir.Dir) bool {
	st, err := os.Lstat(newBootMarker(d, ipamdir.OwnedMarker).path)
	return err == nil && st.Mode().IsRegular()
}

// markOwned writes ipamdir.OwnedMarker unless it is there: the first step of an
// ADD, before the delegate can make NAT rules.
func markOwned(d ipamdir.Dir) error {
	if owns(d) {
		return nil
	}
	return newBootMarker(d, ipamdir.OwnedMarker).write([]byte(d.Network + "\n"))
}

// ClaimNotTmpfsWarning reports whether the warning that dataDir is not on
// tmpfs is still due in this boot for d.Network, and records that it is
// being given, so that a runtime's log gets it once per boot and network
// rather than on every ADD. When the marker cannot be read or written it
// says the warning is due (better repeated than lost) and returns why.
func (s *Attacher) ClaimNotTmpfsWarning(d ipamdir.Dir) (bool, error) {
	bootID, err := s.Host.BootID()
	if err != nil {
		return true, err
	}
	m := newBootMarker(d, ipamdir.NotTmpfsWarnedMarker)
	if m.current(bootID) {
		return false, nil
	}
	if err := m.set(bootID); err != nil {
		return true, fmt.Errorf("record that the tmpfs warning was given: %w", err)
	}
	return true, nil
}

// sweepDue reports whether a CHECK should sweep d now: with interval 0
// always, else when no sweep of d ended in this boot, or the last one ended
// interval ago or more (or in the future: a clock set back). A stale
// attachment so waits at most interval longer than it would with a sweep
// on every CHECK, until the next CHECK after it; GC and `gc` always sweep.
func (s *Sweeper) sweepDue(d ipamdir.Dir, interval time.Duration) bool {
	if interval <= 0 {
		return true
	}
	ended, ok := s.LastSweep(d)
	if !ok {
		return true
	}
	since := s.Host.Now().Sub(ended)
	return since >= interval || since < 0
}

// LastSweep is when the last CHECK sweep of d ended, in this boot.
func (s *Sweeper) LastSweep(d ipamdir.Dir) (time.Time, bool) {
	b, err := statefile.ReadFileNoFollow(newBootMarker(d, ipamdir.LastSweepMarker).path)
	if err != nil {
		return time.Time{}, false
	}
	bootID, nanos, _ := strings.Cut(string(b), " ")
	ended, err := strconv.ParseInt(nanos, 10, 64)
	if id, idErr := s.Host.BootID(); err != nil || idErr != nil || bootID != id {
		return time.Time{}, false
	}
	return time.Unix(0, ended), true
}

// sweepEnded remembers when a CHECK's (or `gc`'s) sweep of d ended, for
// sweepDue: the one write a sweep adds when nothing is stale. Failing to
// is logged: the next CHECK then sweeps again, which is only slower.
func (s *Sweeper) sweepEnded(d ipamdir.Dir) {
	bootID, err := s.Host.BootID()
	if err == nil {
		err = newBootMarker(d, ipamdir.LastSweepMarker).set(bootID + " " + strconv.FormatInt(s.Host.Now().UnixNano(), 10))
	}
	if err != nil {
		s.logf("%s: %v", d.Network, err)
	}
}

// Releases is how many attachments of d were released, by cause, across
// runs (for `metrics`).
func (s *Env) Releases(d ipamdir.Dir) map[string]int {
	counts := map[string]int{}
	if b, err := statefile.ReadFileNoFollow(newBootMarker(d, ipamdir.ReleasesMarker).path); err == nil {
		_ = json.Unmarshal(b, &counts) // damaged: counted again from zero
	}
	return counts
}

// countReleases adds released attachments to d's counts, with the caller
// holding host-local's lock (every release does). Failing to is logged:
// only the metric is off.
func (s *Env) countReleases(d ipamdir.Dir, add map[string]int) {
	n := 0
	for _, k := range add {
		n += k
	}
	if n == 0 {
		return
	}
	counts := s.Releases(d)
	for cause, k := range add {
		if k > 0 {
			counts[cause] += k
		}
	}
	b, err := json.Marshal(counts)
	if err == nil {
		err = newBootMarker(d, ipamdir.ReleasesMarker).write(b)
	}
	if err != nil {
		s.logf("%s: count releases: %v", d.Network, err)
	}
}
