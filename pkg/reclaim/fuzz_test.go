package reclaim

import (
	"net"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/disk"
)

// FuzzParseLease: any lease content either parses to a key that host-local's
// own matching would find the file by, or is reported as damaged.
func FuzzParseLease(f *testing.F) {
	for _, seed := range []string{"c1\r\neth0", "c1", "", "  \r\n ", "a b\r\neth0", "c1\r\neth0\r\nextra", "c1\neth0", "\x00", strings.Repeat("x", 100)} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		key, content, err := parseLease(data)
		if err != nil {
			return
		}
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

// FuzzLeaseName: leaseName takes a name for an address exactly when
// host-local would have named that address's lease so (net.IP.String),
// and gives that address.
func FuzzLeaseName(f *testing.F) {
	for _, s := range []string{"10.0.0.2", "010.0.0.2", "10.0.0", "::ffff:10.0.0.2", "fd00::2", "FD00::2", "fd00:0::2", "fe80::1%eth0", "1.2.3.4%x", "last_reserved_ip.0", "", "1.2.3.4 "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		got, ok := leaseName(name)
		ip := net.ParseIP(name)
		want := ip != nil && ip.String() == name
		if ok != want || (ok && got != ip16(ip)) {
			t.Fatalf("leaseName(%q) = %v, %v; host-local's name of %v is %q", name, got, ok, ip, ip.String())
		}
	})
}

// FuzzAddressOf: addressOf takes what net.ParseCIDR takes, and gives the
// same address.
func FuzzAddressOf(f *testing.F) {
	for _, s := range []string{"10.0.0.2/24", "10.0.0.2/33", "10.0.0.2/024", "::ffff:10.0.0.2/120", "::ffff:10.0.0.2/24", "fd00::2/64", "fe80::1%eth0/64", "10.0.0.2", "/24", "1.2.3.4/-1", "1.2.3.4/+8"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, cidr string) {
		got, ok := addressOf(cidr)
		want, _, err := net.ParseCIDR(cidr)
		if ok != (err == nil) || (ok && !got.Equal(want)) || (ok && ip16(got) != ip16(want)) {
			t.Fatalf("addressOf(%q) = %v, %v; net.ParseCIDR: %v, %v", cidr, got, ok, want, err)
		}
	})
}
