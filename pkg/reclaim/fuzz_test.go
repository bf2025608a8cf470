package reclaim

import (
	"strings"
	"testing"

	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/disk"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// FuzzParseLease: any lease content either parses to a key that host-local's
// own matching would find the file by, or is reported as damaged.
func FuzzParseLease(f *testing.F) {
	for _, seed := range []string{"c1\r\neth0", "c1", "", "  \r\n ", "a b\r\neth0", "c1\r\neth0\r\nextra", "c1\neth0", "\x00", strings.Repeat("x", 100)} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cid, ifName, content, err := ipamdir.ParseLease(data)
		if err != nil {
			return
		}
		key := records.Key{ContainerID: cid, IfName: ifName}
		if content != strings.TrimSpace(string(data)) {
			t.Fatalf("content %q is not the trimmed file %q", content, data)
		}
		want := key.ContainerID
		if key.IfName != "" {
			want += disk.LineBreak + key.IfName
		}
		if want != content || key.ContainerID == "" {
			t.Fatalf("key %+v does not spell the content %q", key, content)
		}
	})
}
