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
	withKernelIPv6(t, true)
	fakeTables(t, "iptables", legacyFailing("ip6tables", "Address family not supported by protocol"))
	// With IPv6 up, the fake is what the cleaner asks, and its failure is one.
	if err := cleanerVerbs(); err == nil {
		t.Fatal("a failing ip6tables on a kernel with IPv6 went unnoticed")
	}
	withKernelIPv6(t, false)
	if err := cleanerVerbs(); err != nil {
		t.Errorf("on a kernel without IPv6: %v", err)
	}
}

// A kernel built without the legacy xtables tables (Linux 6.17 made them
// optional), or without one of them, where the host's iptables is still
// iptables-legacy: every listing fails as the fake iptables below does,
// and no rule can be in that family's table. bridge and portmap then skip
// that family (utils.SupportsIPTables, portmap's maybeGetIptables) and
// work on nftables, and their DELs succeed. Regression: every DEL, sweep
// and firewall-rule listing failed on such a host. What the kernel refuses
// for another reason (not root) is still a failure. ip6tables is the real
// one, in a network namespace of its own.
func TestAFamilyWhoseTablesTheKernelLacksHoldsNoRule(t *testing.T) {
	withKernelIPv6(t, true)
	fakeTables(t, "ip6tables", legacyFailing("iptables", "Table does not exist (do you need to insmod?)"))
	if err := cleanerVerbs(); err != nil {
		t.Errorf("with iptables' tables missing from the kernel: %v", err)
	}
	fakeTables(t, "ip6tables", legacyFailing("iptables", "Permission denied (you must be root)"))
	if err := cleanerVerbs(); err == nil {
		t.Error("an iptables refused for want of privilege went unnoticed")
	}
}

// withKernelIPv6 points kernelIPv6 at a file that exists or not, for the
// test.
func withKernelIPv6(t *testing.T, up bool) {
	t.Helper()
	old := kernelIPv6
	t.Cleanup(func() { kernelIPv6 = old })
	kernelIPv6 = filepath.Join(t.TempDir(), "if_inet6")
	if up {
		if err := os.WriteFile(kernelIPv6, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// fakeTables puts first in PATH the real command real, run in a network
// namespace of its own, and the other family's command as failing says.
func fakeTables(t *testing.T, real string, failing map[string]string) {
	t.Helper()
	if missing := testhost.MissingTools(real, "unshare"); len(missing) > 0 {
		testhost.SkipOrFail(t, fmt.Sprintf("needs %v", missing))
	}
	path, _ := exec.LookPath(real)
	bin := t.TempDir()
	failing[real] = "exec unshare -n " + path + " \"$@\""
	for name, script := range failing {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
}

// legacyFailing is cmd failing as iptables-legacy does when it cannot
// initialize the table -t names, for why (exit status 3).
func legacyFailing(cmd, why string) map[string]string {
	return map[string]string{cmd: "t=filter\nwhile [ $# -gt 0 ]; do [ \"$1\" = -t ] && t=$2; shift; done\n" +
		"echo \"" + cmd + " v1.8.9 (legacy): can't initialize " + cmd + " table \\`$t': " + why + "\" >&2\n" +
		"echo 'Perhaps " + cmd + " or your kernel needs to be upgraded.' >&2\nexit 3"}
}

// cleanerVerbs asks iptables what a DEL and a sweep ask: an attachment's
// rules released, the firewall rules listed.
func cleanerVerbs() error {
	c := &Cleaner{findTables: hostTables}
	if _, err := c.ReleaseAttachment("nomad", "eth0", "gone", true); err != nil {
		return err
	}
	_, err := c.ListForward()
	return err
}
