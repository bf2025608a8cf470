package records

import (
	"encoding/json"
	"reflect"
	"sync/atomic"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
)

// FuzzDecode: a record file with any content and any name either decodes
// to a record that belongs exactly where it was found, or is an error.
func FuzzDecode(f *testing.F) {
	f.Add("c1@eth0", []byte(`{"version":1,"network":"nomad","containerID":"c1","ifName":"eth0","netns":"/var/run/netns/x","netnsID":{"dev":4,"ino":1},"bootID":"b","created":"2026-12-01T00:00:00Z","state":"complete","ips":["10.0.0.2/24"]}`))
	f.Add("c1@eth0", []byte(`{"version":1,"network":"nomad","containerID":"c1","ifName":"eth0","state":"pending","pid":-1}`))
	f.Add("c1@eth0", []byte(`{"version":2}`))
	f.Add("x", []byte(``))
	f.Add("c1@eth0", []byte(`{"version":1,"network":"other","containerID":"c1","ifName":"eth0","state":"complete"}`))
	f.Fuzz(func(t *testing.T, name string, data []byte) {
		s := NewStore(ipamdir.New("/nonexistent", "nomad"))
		r, err := s.decode(name, data, nil)
		if err != nil {
			return
		}
		if r.Network != "nomad" || fileName(r.Key()) != name || r.ContainerID == "" || r.IfName == "" {
			t.Fatalf("decoded %+v from %q", r, name)
		}
		if r.State != Started && r.State != Complete && r.State != Migrated {
			t.Fatalf("state %q", r.State)
		}
	})
}

// FuzzDecodeFastAgrees: whatever decodeFast accepts, encoding/json accepts
// too and decodes to the same Record; so the fast path changes no outcome.
func FuzzDecodeFastAgrees(f *testing.F) {
	for _, seed := range fastSeeds {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var fast Record
		if !decodeFast(data, &fast, knownStrings{}) {
			return
		}
		var slow Record
		if err := json.Unmarshal(data, &slow); err != nil {
			t.Fatalf("fast path accepted %q, encoding/json says %v", data, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%q: fast %+v, encoding/json %+v", data, fast, slow)
		}
	})
}

// FuzzDecodeFastKnownAgrees: the strings a walk offers decodeFast to share
// (its network, the file name's parts, the boot ID decoded before) change
// no value, whether they match or not: the record is the one encoding/json
// decodes.
func FuzzDecodeFastKnownAgrees(f *testing.F) {
	for _, seed := range fastSeeds {
		f.Add([]byte(seed), "c1@eth0", "nomad", "0b6e")
		f.Add([]byte(seed), "c2@eth1", "other", "0b6")
	}
	f.Fuzz(func(t *testing.T, data []byte, name, network, bootID string) {
		var last atomic.Pointer[string]
		last.Store(&bootID)
		var fast Record
		if !decodeFast(data, &fast, knownStrings{network: network, name: name, bootID: &last}) {
			return
		}
		var slow Record
		if err := json.Unmarshal(data, &slow); err != nil {
			t.Fatalf("fast path accepted %q, encoding/json says %v", data, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%q (known %q %q %q): fast %+v, encoding/json %+v", data, name, network, bootID, fast, slow)
		}
		if p := last.Load(); *p != slow.BootID && slow.BootID != "" {
			t.Fatalf("boot ID %q decoded, %q kept for the next record", slow.BootID, *p)
		}
	})
}

var fastSeeds = []string{
	`{"version":1,"network":"nomad","containerID":"c1","ifName":"eth0","netns":"/var/run/netns/x","netnsID":{"dev":4,"ino":4026532}` +
		`,"netnsCookie":8193,"bootID":"0b6e","created":"2026-12-01T00:00:00.123456789Z","state":"complete","ips":["10.0.0.2/24","fd00::2/64"]}`,
	`{"version":1,"state":"pending","pid":42,"pidStart":99,"ips":[]}`,
	`{"version":1,"state":"pending","pid":42,"pidStart":99,"deadline":1764660300}`,
	`{"deadline":-5}`,
	` { "version" : 1 , "ips" : [ "a" , "b" ] , "netnsID" : { } } `,
	`{"version":1,"version":2,"ips":["a"],"ips":["b"],"netnsID":{"dev":1},"netnsID":{"ino":2}}`,
	`{"version":-0,"pid":-7}`,
	`{}`,
	`{"version":01}`,
	`{"version":1.0}`,
	`{"version":1e3}`,
	`{"pidStart":-1}`,
	`{"pidStart":18446744073709551615}`,
	`{"pidStart":18446744073709551616}`,
	`{"Version":1}`,
	`{"ips":null}`,
	`{"netns":"a\"b"}`,
	"{\"netns\":\"\xff\"}",
	"{\"netns\":\"\x01\"}",
	`{"created":"yesterday"}`,
	`{"version":1}x`,
	`{"version":1,}`,
	`{"extra":1}`,
}

// FuzzDecodeWalkCache: a walk cache file with any content either decodes
// to records that encode back to the same file, each under a record's
// name with a nonzero inode and bounded bytes, or is refused whole.
func FuzzDecodeWalkCache(f *testing.F) {
	f.Add(encodeWalkCache([]cachedRecord{{name: "c1@eth0", ino: 7, data: []byte(`{"version":1}`)}}))
	f.Add(encodeWalkCache([]cachedRecord{{name: "c1@eth0", ino: 1, data: []byte("a")}, {name: "c2@eth1", ino: 2, data: []byte("b\n")}}))
	f.Add([]byte(walkCacheMagic + "1\n7 7 2\nc1@eth0{}\n"))
	f.Add([]byte(walkCacheMagic + "0\n"))
	f.Add([]byte(walkCacheMagic + "1\n18446744073709551615 7 1\nc1@eth0x\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, ok := decodeWalkCache(b)
		if !ok {
			return
		}
		recs := make([]cachedRecord, 0, len(c))
		for name, e := range c {
			if _, _, ok := ipamdir.ParseRecordName(name); !ok || e.name != name || e.ino == 0 || len(e.data) == 0 || len(e.data) > statefile.DefaultLimit {
				t.Fatalf("decoded %q as %+v", name, e)
			}
			recs = append(recs, e)
		}
		again, ok := decodeWalkCache(encodeWalkCache(recs))
		if !ok || !reflect.DeepEqual(again, c) {
			t.Fatalf("decode(encode(%v)) = %v, %v", c, again, ok)
		}
	})
}
