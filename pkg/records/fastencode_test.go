package records

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

// encode writes what encoding/json writes, byte for byte, for the records
// a verb writes and for those it leaves to encoding/json.
func TestEncodeAgrees(t *testing.T) {
	created := time.Date(2026, 12, 6, 3, 4, 5, 123456789, time.UTC)
	for _, r := range []Record{
		{},
		{Version: FormatVersion, Network: "nomad", ContainerID: "c1", IfName: "eth0", Netns: "/var/run/netns/x",
			NetnsID: sysinfo.NetnsID{Dev: 4, Ino: 4026532}, NetnsCookie: 8193, BootID: "0b6e", Created: created,
			State: Started, PID: 42, PIDStart: 99, Deadline: 1764660300},
		{Version: FormatVersion, Network: "nomad", ContainerID: "c1", IfName: "eth0", Created: created, State: Complete,
			IPs: []string{"10.0.0.2/24", "fd00::2/64"}},
		{State: Migrated, LegacyLeases: []string{"/var/lib/cni/networks/nomad/10.0.0.2"}, IPs: []string{}},
		{Version: -1, PID: -7, Created: created.In(time.FixedZone("x", 5*3600+30*60))},
		{Netns: `a"b`}, {Netns: `a\b`}, {Network: "<&>"}, {BootID: "\x01"}, {IfName: "\xff"}, {ContainerID: "é"},
		{IPs: []string{"ok", "\u2028"}}, {LegacyLeases: []string{"a>"}}, {State: "x\ty"},
	} {
		want, werr := json.Marshal(&r)
		got, gerr := encode(&r)
		if !bytes.Equal(got, want) || (gerr == nil) != (werr == nil) {
			t.Errorf("encode(%+v) = %s, %v; encoding/json: %s, %v", r, got, gerr, want, werr)
		}
	}
	// A time encoding/json refuses is refused the same way.
	r := Record{Created: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}
	if _, err := encode(&r); err == nil {
		t.Errorf("encode of a year-10000 time: no error, encoding/json refuses it")
	}
}

// FuzzEncodeAgrees: for any record, encode writes what encoding/json
// writes (or fails where it fails).
func FuzzEncodeAgrees(f *testing.F) {
	f.Add(1, "nomad", "c1", "eth0", "/var/run/netns/x", "0b6e", "pending", "10.0.0.2/24", uint64(4), uint64(4026532), uint64(8193), 42, uint64(99), uint64(1764660300), int64(1796525102123456789), 0)
	f.Add(0, "", "", "", "", "", "", "", uint64(0), uint64(0), uint64(0), 0, uint64(0), uint64(0), int64(0), 3600)
	f.Add(-1, `a"<`, "\xff", "\x00", "é", "\u2028", "&", "\\", uint64(1<<63), uint64(0), uint64(1), -1, uint64(0), uint64(0), int64(-1), -1)
	f.Fuzz(func(t *testing.T, version int, network, cid, ifName, netns, bootID, state, ip string, dev, ino, cookie uint64, pid int, pidStart, deadline uint64, created int64, offset int) {
		r := Record{Version: version, Network: network, ContainerID: cid, IfName: ifName, Netns: netns,
			NetnsID: sysinfo.NetnsID{Dev: dev, Ino: ino}, NetnsCookie: cookie, BootID: bootID,
			Created: time.Unix(0, created).In(time.FixedZone("", offset%(100*3600))), State: Phase(state),
			PID: pid, PIDStart: pidStart, Deadline: deadline}
		if ip != "" {
			r.IPs = []string{ip, ip + "/24"}
			r.LegacyLeases = []string{netns + ip}
		}
		want, werr := json.Marshal(&r)
		got, gerr := encode(&r)
		if !bytes.Equal(got, want) || (gerr == nil) != (werr == nil) {
			t.Fatalf("encode(%+v) = %s, %v; encoding/json: %s, %v", r, got, gerr, want, werr)
		}
	})
}
