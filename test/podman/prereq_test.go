package podman

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/hostcmd"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

const pluginType = "nomad-bridge-cni"

// referencePlugins are what podman's bridge networks chain (bridge with
// host-local, portmap, firewall, tuning), as `make plugins` builds them.
var referencePlugins = []string{"bridge", "host-local", "portmap", "firewall", "tuning"}

// hostTools are the commands the tests run besides podman itself: runc and
// nsenter to play the reboot and look into namespaces, the rest to set up
// and clean up.
var hostTools = []string{"podman", "runc", "ip", "iptables", "ip6tables", "nsenter", "mount", "umount"}

var hostPrereqs = testhost.Prereqs{What: "podman test prerequisites", Hint: ".ci/run installs podman, runc and busybox-static with apt-get", Check: missingHostPrereqs}

// requireHost skips the test, saying why, when the host cannot run podman
// tests. With CI set it fails instead: a CI run must never pass by skipping.
func requireHost(t *testing.T) {
	t.Helper()
	hostPrereqs.Require(t)
}

func missingHostPrereqs() []string {
	missing := testhost.MissingTools(hostTools...)
	if err := checkStaticBusybox(); err != nil {
		missing = append(missing, err.Error())
	}
	if len(missing) > 0 {
		return missing
	}
	for _, ipt := range []string{"iptables", "ip6tables"} {
		if out, err := exec.Command(ipt, "-w", "-t", "nat", "-S", "POSTROUTING").CombinedOutput(); err != nil {
			missing = append(missing, fmt.Sprintf("a working %s nat table (%v: %s)", ipt, err, bytes.TrimSpace(out)))
		}
	}
	return missing
}

// busyboxPath is where Debian's busybox-static installs the binary that
// becomes the test image.
const busyboxPath = "/bin/busybox"

// checkStaticBusybox makes sure the image can be a single file: a dynamic
// busybox (Debian's busybox package) would need its libraries inside.
func checkStaticBusybox() error {
	f, err := elf.Open(busyboxPath)
	if err != nil {
		return fmt.Errorf("a static %s (package busybox-static): %w", busyboxPath, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("a static %s (it is dynamically linked: install busybox-static)", busyboxPath)
		}
	}
	return nil
}

// requireAsBridge skips (fails in CI) unless the plugin, installed as
// `bridge` in front of the reference plugins, answers as itself and hands
// a verb to the real bridge behind it. Both are asked of a copy in a
// directory of its own, without touching the host: run with no arguments
// (the line runtimes fingerprint), and STATUS for an entry of "type":
// "bridge" with a dataDir in a temporary directory. (A plugin that cannot
// run as `bridge` refuses that entry itself: its delegate would be itself.)
func requireAsBridge(t *testing.T, bin string) {
	t.Helper()
	if reason := asBridgeUnsupported(t, bin); reason != "" {
		testhost.SkipOrFail(t, "the plugin installed as `bridge` does not delegate to the next bridge in CNI_PATH: "+reason)
	}
}

func asBridgeUnsupported(t *testing.T, bin string) string {
	t.Helper()
	dir := t.TempDir()
	front := filepath.Join(dir, "front")
	if err := os.MkdirAll(front, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := hostcmd.Run(cmdTimeout, "install", "-m", "0755", filepath.Join(bin, pluginType), filepath.Join(front, "bridge")); err != nil {
		t.Fatal(err)
	}
	cniPath := "CNI_PATH=" + front + string(os.PathListSeparator) + bin

	asBridge := filepath.Join(front, "bridge")
	about := cniexec.Run(t, asBridge, invoke.Args{}, cniexec.Opts{Env: []string{cniPath}, Timeout: cmdTimeout, Combined: true})
	if about.Err != nil || !strings.Contains(about.Stdout, pluginType) {
		return fmt.Sprintf("%s with no arguments printed %q (%v), want a line naming %s", asBridge, strings.TrimSpace(about.Stdout), about.Err, pluginType)
	}
	status := fmt.Sprintf(`{"cniVersion": "1.1.0", "name": "nbp-probe", "type": "bridge", "bridge": "nbpprobe0", "dataDir": %q,
		"ipam": {"type": "host-local", "ranges": [[{"subnet": "192.0.2.0/24"}]]}}`, filepath.Join(dir, "data"))
	r := cniexec.Run(t, asBridge, invoke.Args{Command: "STATUS"}, cniexec.Opts{Stdin: []byte(status), Env: []string{cniPath}, Timeout: cmdTimeout, Combined: true})
	// An error of the delegate's own (prefixed so by the plugin) also
	// proves that the verb reached the real bridge: one older than STATUS
	// (before v1.2.0) answers it with an error.
	if r.Err != nil && !strings.Contains(r.Stdout, "delegate bridge failed (status)") {
		return fmt.Sprintf("STATUS through %s: %v", asBridge, r.Err)
	}
	return ""
}
