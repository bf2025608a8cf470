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

// markedThisBoot reports whether marker m of d was written in the boot
// bootID. A missing or unreadable marker is not: the work is done again.
func markedThisBoot(d ipamdir.Dir, m ipamdir.Marker, bootID string) bool {
	b, err := statefile.ReadFileNoFollow(d.Marker(m))
	return err == nil && string(b) == bootID
}

// writeMarker replaces the content of marker m of d, atomically.
func writeMarker(d ipamdir.Dir, m ipamdir.Marker, b []byte) error {
	if err := os.MkdirAll(d.Records(), 0o700); err != nil {
		return fmt.Errorf("create %s: %w", d.Records(), err)
	}
	if err := statefile.WriteAtomic(d.Marker(m), b, nil); err != nil {
		return fmt.Errorf("write %s: %w", d.Marker(m), err)
	}
	return nil
}

func writeJSONMarker(d ipamdir.Dir, m ipamdir.Marker, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return writeMarker(d, m, b)
}

// readJSONMarker reads marker m of d into v; a missing or damaged one
// leaves v as it is (a count or a hint lost, nothing more).
func readJSONMarker(d ipamdir.Dir, m ipamdir.Marker, v any) {
	if b, err := statefile.ReadFileNoFollow(d.Marker(m)); err == nil {
		_ = json.Unmarshal(b, v)
	}
}

// Owns reports whether the network in d is proved the plugin's: an ADD
// through it marked it (ipamdir.OwnedMarker, a regular file, not followed).
func Owns(d ipamdir.Dir) bool {
	st, err := os.Lstat(d.Marker(ipamdir.OwnedMarker))
	return err == nil && st.Mode().IsRegular()
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
	if markedThisBoot(d, ipamdir.NotTmpfsWarnedMarker, bootID) {
		return false, nil
	}
	if err := writeMarker(d, ipamdir.NotTmpfsWarnedMarker, []byte(bootID)); err != nil {
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
	b, err := statefile.ReadFileNoFollow(d.Marker(ipamdir.LastSweepMarker))
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
		err = writeMarker(d, ipamdir.LastSweepMarker, []byte(bootID+" "+strconv.FormatInt(s.Host.Now().UnixNano(), 10)))
	}
	if err != nil {
		s.Logf("%s: %v", d.Network, err)
	}
}

// Releases is how many attachments of d were released, by cause, across
// runs (for `metrics`).
func (s *Env) Releases(d ipamdir.Dir) map[string]int {
	counts := map[string]int{}
	readJSONMarker(d, ipamdir.ReleasesMarker, &counts)
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
	if err := writeJSONMarker(d, ipamdir.ReleasesMarker, counts); err != nil {
		s.Logf("%s: count releases: %v", d.Network, err)
	}
}
