package records

import (
	"reflect"
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
		r, err := s.decode(name, data)
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
