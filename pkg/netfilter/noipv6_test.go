package netfilter

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// A kernel booted with ipv6.disable=1 runs no IPv6, and ip6tables-legacy
// fails every listing there as the fake below does (as reported by
// Cilium's and Kilo's users on Ubuntu 20.04); no IPv6 rule can exist, so
// that family is not the cleaner's. Regression: every DEL, sweep and
// firewall-rule listing failed on such a host. iptables runs in a network
// namespace of its own.
func TestAKernelWithoutIPv6HasNoIP6TablesFamily(t *testing.T) {
	if missing := testhost.MissingTools("iptables", "unshare"); len(missing) > 0 {
		testhost.SkipOrFail(t, fmt.Sprintf("needs %v", missing))
	}
	real, _ := exec.LookPath("iptables")
	bin := t.TempDir()
	for name, script := range map[string]string{
		"iptables": "exec unshare -n " + real + " \"$@\"",
		"ip6tables": "t=filter\nwhile [ $# -gt 0 ]; do [ \"$1\" = -t ] && t=$2; shift; done\n" +
			"echo \"ip6tables v1.8.4 (legacy): can't initialize ip6tables table \\`$t': Address family not supported by protocol\" >&2\nexit 3",
	} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	old := kernelIPv6
	t.Cleanup(func() { kernelIPv6 = old })
	verbs := func() error {
		c := &Cleaner{findTables: hostTables}
		if _, err := c.ReleaseAttachment("nomad", "eth0", "gone", true); err != nil {
			return err
		}
		_, err := c.ListForward()
		return err
	}

	// With IPv6 up, the fake is what the cleaner asks, and its failure is one.
	kernelIPv6 = filepath.Join(t.TempDir(), "if_inet6")
	if err := os.WriteFile(kernelIPv6, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := verbs(); err == nil {
		t.Fatal("a failing ip6tables on a kernel with IPv6 went unnoticed")
	}
	kernelIPv6 = filepath.Join(t.TempDir(), "if_inet6")
	if err := verbs(); err != nil {
		t.Errorf("on a kernel without IPv6: %v", err)
	}
}
