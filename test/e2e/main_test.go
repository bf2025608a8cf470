package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/internal/iptstate"
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
	snap := snapshotHost()
	code := m.Run()
	if err := snap.restore(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: restoring host state: %v\n", err)
		if code == 0 {
			code = 1
		}
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

// hostSnapshot is what the host looked like before the package ran, so that
// shared things this package created (portmap's and firewall's shared
// chains, cache directories, forwarding sysctls) can be removed afterwards,
// while anything that existed before is left alone.
type hostSnapshot struct {
	active  bool
	chains  map[string]map[string]bool // "fam/table" -> chains
	sysctls map[string]string
	dirs    map[string]bool
}

var snapshotSysctls = []string{
	"/proc/sys/net/ipv4/ip_forward",
	"/proc/sys/net/ipv6/conf/all/forwarding",
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
	s := &hostSnapshot{chains: map[string]map[string]bool{}, sysctls: map[string]string{}, dirs: map[string]bool{}}
	if len(missingHostPrereqs()) > 0 {
		return s // the tests skip or fail; they create nothing
	}
	s.active = true
	iptstate.EachTable(func(fam, table string, tb ipTable) []error {
		s.chains[fam+"/"+table] = tb.Chains
		return nil
	})
	for _, p := range snapshotSysctls {
		if raw, err := os.ReadFile(p); err == nil {
			s.sysctls[p] = strings.TrimSpace(string(raw))
		}
	}
	for _, d := range snapshotDirs {
		_, err := os.Stat(d)
		s.dirs[d] = err == nil
	}
	return s
}

// restore removes what the package created and nobody else uses anymore.
func (s *hostSnapshot) restore() error {
	if !s.active {
		return nil
	}
	var errs []error
	for _, fam := range ipFamilies {
		errs = append(errs, s.restoreSharedChains(fam)...)
	}
	for p, v := range s.sysctls {
		raw, err := os.ReadFile(p)
		if err == nil && strings.TrimSpace(string(raw)) != v {
			if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("restore %s: %w", p, err))
			}
		}
	}
	for _, d := range snapshotDirs {
		if s.dirs[d] {
			continue
		}
		// Remove only if empty: anything inside is somebody's state.
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) && !isNotEmpty(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func isNotEmpty(err error) bool {
	return err != nil && strings.Contains(err.Error(), "directory not empty")
}

// restoreSharedChains deletes the shared portmap/firewall chains that did
// not exist before the package ran, once idle (see
// iptstate.RemoveIdleSharedChains). Every test has already verified that
// none of its own rules are left, so rules still in a chain are somebody
// else's (e.g. a container started meanwhile): the chain is in use, and
// left.
func (s *hostSnapshot) restoreSharedChains(fam string) []error {
	return iptstate.RemoveIdleSharedChains(fam, func(table, chain string) bool {
		return s.chains[fam+"/"+table][chain]
	}, func(table, chain string, rules []ipRule) {
		fmt.Fprintf(os.Stderr, "e2e: leaving %s -t %s %s, it is in use:\n%s", fam, table, chain, rulesString(rules))
	})
}
