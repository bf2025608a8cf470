package netfilter

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

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
	if missing := testhost.MissingTools("ip6tables", "unshare"); len(missing) > 0 {
		testhost.SkipOrFail(t, fmt.Sprintf("needs %v", missing))
	}
	real, _ := exec.LookPath("ip6tables")
	old := kernelIPv6
	t.Cleanup(func() { kernelIPv6 = old })
	kernelIPv6 = filepath.Join(t.TempDir(), "if_inet6")
	if err := os.WriteFile(kernelIPv6, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	verbs := func(why string) error {
		bin := t.TempDir()
		for name, script := range map[string]string{
			"ip6tables": "exec unshare -n " + real + " \"$@\"",
			"iptables": "t=filter\nwhile [ $# -gt 0 ]; do [ \"$1\" = -t ] && t=$2; shift; done\n" +
				"echo \"iptables v1.8.9 (legacy): can't initialize iptables table \\`$t': " + why + "\" >&2\n" +
				"echo 'Perhaps iptables or your kernel needs to be upgraded.' >&2\nexit 3",
		} {
			if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
		c := &Cleaner{findTables: hostTables}
		if _, err := c.ReleaseAttachment("nomad", "eth0", "gone", true); err != nil {
			return err
		}
		_, err := c.ListForward()
		return err
	}
	if err := verbs("Table does not exist (do you need to insmod?)"); err != nil {
		t.Errorf("with iptables' tables missing from the kernel: %v", err)
	}
	if err := verbs("Permission denied (you must be root)"); err == nil {
		t.Error("an iptables refused for want of privilege went unnoticed")
	}
}
