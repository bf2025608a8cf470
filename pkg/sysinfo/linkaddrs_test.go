package sysinfo

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	kitns "github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/netns"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// LinkAddrs is what DEL expects bridge to find on the container's link:
// every address `ip` lists on it, IPv4 and IPv6, and nothing (no error)
// for a link that is not there: whether the host has an id for the
// namespace (bridge's veth gives it one) or not, and never about the
// host's own link of that name.
func TestLinkAddrsInANamespace(t *testing.T) {
	if missing := testhost.MissingTools("ip"); len(missing) > 0 {
		testhost.SkipOrFail(t, "making a namespace needs "+strings.Join(missing, ", "))
	}
	ip := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// The namespace's link has the name of a host link with addresses of
	// its own: an answer about the wrong namespace shows.
	link := fmt.Sprintf("nbl%x", time.Now().UnixNano()%0xfffffff)
	ip("link", "add", link, "type", "veth", "peer", "name", link+"p")
	t.Cleanup(func() { exec.Command("ip", "link", "del", link).Run() })
	ip("addr", "add", "10.251.9.1/24", "dev", link)

	for _, c := range []struct {
		name string
		// outside: the host has an id for the namespace (it names the
		// test's namespace, nothing else).
		outside bool
		make    func(ns string)
	}{
		{"a veth inside the namespace only", false, func(ns string) {
			ip("-n", ns, "link", "add", link, "type", "veth", "peer", "name", "d1")
		}},
		{"a veth from the host, as bridge makes", true, func(ns string) {
			host := "nbh" + link[3:]
			ip("link", "add", host, "type", "veth", "peer", "name", link, "netns", ns)
			t.Cleanup(func() { exec.Command("ip", "link", "del", host).Run() })
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			named := kitns.New(t, "nbc-linkaddrs")
			ns := named.Name
			c.make(ns)
			ip("-n", ns, "addr", "add", "10.250.0.2/24", "dev", link)
			ip("-n", ns, "addr", "add", "10.250.1.2/24", "dev", link)
			ip("-n", ns, "addr", "add", "fd00:250::2/64", "dev", link, "nodad")
			ip("-n", ns, "link", "set", link, "up")
			ip("-n", ns, "link", "add", "other", "type", "veth", "peer", "name", "otherp")
			ip("-n", ns, "addr", "add", "10.252.0.2/24", "dev", "other")

			var want []string
			for _, line := range strings.Split(strings.TrimSpace(ip("-n", ns, "-o", "addr", "show", "dev", link)), "\n") {
				f := strings.Fields(line)
				for i := range f[:len(f)-1] {
					if f[i] == "inet" || f[i] == "inet6" {
						want = append(want, strings.Split(f[i+1], "/")[0])
					}
				}
			}
			slices.Sort(want)
			path := named.Path
			h := &Real{}
			ips, err := h.LinkAddrs(path, link)
			if got := sorted(ips); err != nil || !slices.Equal(got, want) || len(want) < 3 {
				t.Errorf("LinkAddrs(%s) = %v, %v; ip lists %v", link, got, err, want)
			}
			if ips, err := h.LinkAddrs(path, "eth9"); err != nil || len(ips) != 0 {
				t.Errorf("LinkAddrs of a missing link = %v, %v; want nothing and no error", ips, err)
			}
		})
	}
	h := &Real{}
	if _, err := h.LinkAddrs(filepath.Join(t.TempDir(), "missing"), link); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("LinkAddrs in a missing namespace: %v, want fs.ErrNotExist", err)
	}
	plain := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := h.LinkAddrs(plain, link); !errors.Is(err, ErrNotNetns) {
		t.Errorf("LinkAddrs in a plain file: %v, want ErrNotNetns", err)
	}
}

func sorted(ips []net.IP) []string {
	var s []string
	for _, a := range ips {
		s = append(s, a.String())
	}
	slices.Sort(s)
	return s
}
