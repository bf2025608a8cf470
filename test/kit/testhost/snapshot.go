package testhost

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/iptstate"
)

// forwardingSysctls are what bridge's isGateway turns on.
var forwardingSysctls = []string{
	"/proc/sys/net/ipv4/ip_forward",
	"/proc/sys/net/ipv6/conf/all/forwarding",
}

// Snapshot is what the host looked like before a test package ran, in the
// things the package shares with everything else: the iptables chains of
// every family and table (portmap's and firewall's shared chains are
// created on first use), the forwarding sysctls, and whether each of some
// paths existed. Restore puts back what the package changed there and
// nobody else uses.
type Snapshot struct {
	chains  map[string]map[string]bool // "fam/table" -> chains
	sysctls map[string]string
	existed map[string]bool
	dirs    []string
}

// TakeSnapshot records the host's chains and sysctls, and whether each of
// dirs (created on first use by the plugins, libcni, ...; removed again by
// Restore if the package created them and left them empty) and of other
// paths existed.
func TakeSnapshot(dirs []string, other ...string) *Snapshot {
	s := &Snapshot{chains: map[string]map[string]bool{}, sysctls: map[string]string{}, existed: map[string]bool{}, dirs: dirs}
	iptstate.EachTable(func(fam, table string, tb iptstate.Table) []error {
		s.chains[fam+"/"+table] = tb.Chains
		return nil
	})
	for _, p := range forwardingSysctls {
		if raw, err := os.ReadFile(p); err == nil {
			s.sysctls[p] = strings.TrimSpace(string(raw))
		}
	}
	for _, p := range append(append([]string{}, dirs...), other...) {
		_, err := os.Lstat(p)
		s.existed[p] = err == nil
	}
	return s
}

// ChainExisted reports whether chain of fam's table existed before.
func (s *Snapshot) ChainExisted(fam, table, chain string) bool {
	return s.chains[fam+"/"+table][chain]
}

// Existed reports whether path existed before.
func (s *Snapshot) Existed(path string) bool { return s.existed[path] }

// RestoreSysctlsAndDirs puts the forwarding sysctls back and removes the
// snapshot's directories that did not exist before, if they are empty:
// anything inside is somebody's state.
func (s *Snapshot) RestoreSysctlsAndDirs() []error {
	var errs []error
	for p, v := range s.sysctls {
		raw, err := os.ReadFile(p)
		if err == nil && strings.TrimSpace(string(raw)) != v {
			if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("restore %s: %w", p, err))
			}
		}
	}
	for _, d := range s.dirs {
		if s.existed[d] {
			continue
		}
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) && !strings.Contains(err.Error(), "directory not empty") {
			errs = append(errs, err)
		}
	}
	return errs
}
