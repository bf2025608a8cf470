// Package synth writes synthetic host-local network directories for the
// sweep benchmarks: real lease files ("<containerID>\r\n<ifname>", one per
// IP), host-local's lock and last_reserved_ip.0, and one real attachment
// record per lease, written with the records package so the format is the
// plugin's own. "Live" records name a real network namespace with its
// device and inode and this boot's ID; "stale" ones name a namespace path
// that does not exist.
package synth

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

// Spec describes one synthetic network.
type Spec struct {
	DataDir string
	Network string
	// Leases is how many leases (and records) to write.
	Leases int
	// StalePercent is 0, 50 or 100 (any value 0-100 works: lease i is
	// stale when i*StalePercent/100 changes, which spreads them evenly).
	StalePercent int
	// Base is the first address; leases take Base+1 .. Base+Leases.
	Base netip.Addr
	// LiveNetns is the path of a real network namespace that every live
	// record names.
	LiveNetns string
	// GonePrefix prefixes the (non-existent) namespace paths of stale
	// records.
	GonePrefix string
	// Seed makes container IDs differ between builds.
	Seed string
	// Owned writes the marker an ADD of the plugin writes first
	// (ipamdir.OwnedMarker): a sweep of an owned network lists its NAT
	// rules for the orphans, as on a real node.
	Owned bool
}

// Result says what was written.
type Result struct {
	Live, Stale int
	// StaleIDs are the container IDs of the stale attachments.
	StaleIDs []string
	LiveIDs  []string
}

// ContainerID is a 64-hex container ID like containerd's, derived from
// seed and i.
// deadNetnsIno is the first inode number of stale records' namespaces.
const deadNetnsIno = 1 << 40

func ContainerID(seed string, i int) string {
	s := sha256.Sum256([]byte(fmt.Sprintf("%s/%d", seed, i)))
	return hex.EncodeToString(s[:])
}

// IsStale reports whether lease i of a build with the given percentage is
// stale: evenly interleaved (50% is every other lease).
func IsStale(i, percent int) bool {
	return (i+1)*percent/100 != i*percent/100
}

// Build writes the network directory and records. The network's lease
// and record directories must not exist yet, or must be empty.
func Build(s Spec) (*Result, error) {
	if s.Leases < 0 || s.StalePercent < 0 || s.StalePercent > 100 {
		return nil, errors.New("synth: bad spec")
	}
	h := &sysinfo.Real{}
	bootID, err := h.BootID()
	if err != nil {
		return nil, err
	}
	liveID, err := h.Netns(s.LiveNetns)
	if err != nil {
		return nil, fmt.Errorf("synth: live netns: %w", err)
	}
	netDir := filepath.Join(s.DataDir, s.Network)
	if err := os.MkdirAll(netDir, 0o755); err != nil {
		return nil, err
	}
	// host-local's own files: the flock target and the allocator's cursor.
	if err := os.WriteFile(filepath.Join(netDir, "lock"), nil, 0o644); err != nil {
		return nil, err
	}
	d := ipamdir.New(s.DataDir, s.Network)
	store := records.NewStore(d)
	if err := os.MkdirAll(d.Records(), 0o700); err != nil {
		return nil, err
	}
	// The migration marker a real network carries after its first ADD.
	if err := os.WriteFile(d.Marker(ipamdir.MigratedMarker), []byte(bootID), 0o600); err != nil {
		return nil, err
	}
	if s.Owned {
		if err := os.WriteFile(d.Marker(ipamdir.OwnedMarker), []byte(s.Network+"\n"), 0o600); err != nil {
			return nil, err
		}
	}
	res := &Result{}
	created := time.Now().Add(-time.Minute).UTC()
	ip := s.Base
	var last netip.Addr
	for i := 0; i < s.Leases; i++ {
		ip = ip.Next()
		if !ip.IsValid() {
			return nil, errors.New("synth: address space exhausted")
		}
		last = ip
		cid := ContainerID(s.Seed, i)
		stale := IsStale(i, s.StalePercent)
		rec := &records.Record{
			Version:     records.FormatVersion,
			Network:     s.Network,
			ContainerID: cid,
			IfName:      "eth0",
			BootID:      bootID,
			Created:     created,
			State:       records.Complete,
			IPs:         []string{netip.PrefixFrom(ip, 16).String()},
		}
		if stale {
			rec.Netns = fmt.Sprintf("%s-%d", s.GonePrefix, i)
			// The kernel numbers namespaces below 2^32 (proc_inum), so
			// no namespace on the host can have this inode: a stale
			// record must not look held by some other process's new
			// namespace (then it is detached, and kept).
			rec.NetnsID = sysinfo.NetnsID{Dev: liveID.Dev, Ino: deadNetnsIno + uint64(i)}
			res.Stale++
			res.StaleIDs = append(res.StaleIDs, cid)
		} else {
			rec.Netns = s.LiveNetns
			rec.NetnsID = liveID
			res.Live++
			res.LiveIDs = append(res.LiveIDs, cid)
		}
		// Lease exactly as host-local's disk.Store.Reserve writes it.
		lease := cid + "\r\n" + "eth0"
		if err := os.WriteFile(filepath.Join(netDir, ip.String()), []byte(lease), 0o644); err != nil {
			return nil, err
		}
		if err := store.Write(rec); err != nil {
			return nil, err
		}
	}
	if last.IsValid() {
		if err := os.WriteFile(filepath.Join(netDir, "last_reserved_ip.0"), []byte(last.String()), 0o644); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// Remove deletes a synthetic network (leases and records).
func Remove(dataDir, network string) error {
	if strings.ContainsAny(network, "/") || network == "" {
		return errors.New("synth: bad network name")
	}
	return errors.Join(
		os.RemoveAll(filepath.Join(dataDir, network)),
		os.RemoveAll(ipamdir.New(dataDir, network).Records()),
	)
}

// CountLeases counts the lease files left in a network directory.
func CountLeases(dataDir, network string) (int, error) {
	entries, err := os.ReadDir(filepath.Join(dataDir, network))
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			n++
		}
	}
	return n, nil
}
