package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/iptstate"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// Environment of the listener helper: the test binary re-executes itself
// inside a namespace (`ip netns exec NS e2e.test`) to serve one TCP
// connection, so port-forwarding is proven with real traffic without any
// tool beyond the binaries the tests already need.
const (
	listenEnv = "NBC_E2E_LISTEN"
	tokenEnv  = "NBC_E2E_TOKEN"
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(listenEnv); addr != "" {
		os.Exit(serveOnce(addr, os.Getenv(tokenEnv)))
	}
	if os.Getenv(gcHelperEnv) != "" {
		os.Exit(gcHelperMain(os.Args[1:]))
	}
	if os.Getenv(deadRunEnv) != "" {
		os.Exit(m.Run()) // TestReapDeadRun's run to kill: no reaper, no snapshot
	}
	var reapErr error
	if len(missingHostPrereqs()) == 0 {
		reapErr = reapDeadRuns(os.Stderr)
	}
	snap := snapshotHost()
	code := m.Run()
	if err := snap.restore(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: restoring host state: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	if reapErr != nil && code == 0 {
		code = 1 // printed above, before the tests
	}
	os.Exit(code)
}

// serveOnce accepts one TCP connection on addr and writes token to it.
func serveOnce(addr, token string) int {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer ln.Close()
	// The parent dials only after reading this line: the socket is bound.
	fmt.Println("ready")
	conn, err := ln.Accept()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer conn.Close()
	if _, err := fmt.Fprint(conn, token); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// startListener runs serveOnce inside ns (see netns.enter) on port and
// returns once it listens. Cleanup kills it if the test ends before it is done.
func (e *testEnv) startListener(t *testing.T, ns netns, port int, token string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("test executable: %v", err)
	}
	enter := ns.enter()
	cmd := exec.Command(enter[0], append(enter[1:], exe, "-test.run=^$")...)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=:%d", listenEnv, port), tokenEnv+"="+token)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("listener pipe: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start listener: %v", err)
	}
	e.mu.Lock()
	e.listeners = append(e.listeners, cmd)
	e.mu.Unlock()
	line, err := waitLine(bufio.NewReader(stdout), 30*time.Second)
	if err != nil || line != "ready" {
		t.Fatalf("listener in %s did not come up: %q %v", ns.name, line, err)
	}
	return cmd
}

// ---------------------------------------------------------------------------
// Host state shared by all tests

// hostSnapshot is what the host looked like before the package ran (see
// testhost.Snapshot); inactive when the tests cannot run here and so
// create nothing.
type hostSnapshot struct {
	*testhost.Snapshot
}

// Directories that the plugins or cnitool create on first use.
var snapshotDirs = []string{
	filepath.Join(cnitoolCacheDir, "results"),
	cnitoolCacheDir,
	hostLocalDefaultDir,
	filepath.Join(pluginDefaultDataDir, recordDirName),
	pluginDefaultDataDir,
}

func snapshotHost() *hostSnapshot {
	if len(missingHostPrereqs()) > 0 {
		return &hostSnapshot{} // the tests skip or fail; they create nothing
	}
	return &hostSnapshot{testhost.TakeSnapshot(snapshotDirs)}
}

// restore removes what the package created and nobody else uses anymore.
func (s *hostSnapshot) restore() error {
	if s.Snapshot == nil {
		return nil
	}
	var errs []error
	for _, fam := range ipFamilies {
		errs = append(errs, s.restoreSharedChains(fam)...)
	}
	return errors.Join(append(errs, s.RestoreSysctlsAndDirs()...)...)
}

// restoreSharedChains deletes the shared portmap/firewall chains that did
// not exist before the package ran, once idle (see
// iptstate.RemoveIdleSharedChains). Every test has already verified that
// none of its own rules are left, so rules still in a chain are somebody
// else's (e.g. a container started meanwhile): the chain is in use, and
// left.
func (s *hostSnapshot) restoreSharedChains(fam string) []error {
	return iptstate.RemoveIdleSharedChains(fam, func(table, chain string) bool {
		return s.ChainExisted(fam, table, chain)
	}, func(table, chain string, rules []ipRule) {
		fmt.Fprintf(os.Stderr, "e2e: leaving %s -t %s %s, it is in use:\n%s", fam, table, chain, rulesString(rules))
	})
}
