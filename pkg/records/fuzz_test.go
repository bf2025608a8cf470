package records

import (
	"testing"

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
