// Package operator implements the operator's commands: `leases` shows who
// holds which address and which holders are dead, `gc` runs CHECK's sweep
// by hand. Both read the same state, through the same code, as the plugin.
package operator

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containernetworking/cni/pkg/utils"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// Networks lists the networks under dataDir: host-local's directories and
// the wrapper's record directories, by valid CNI network name. With only
// set, it is that one network, which must exist.
func Networks(dataDir, only string) ([]string, error) {
	fi, err := os.Stat(dataDir)
	if err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("data dir %s is not a directory", dataDir)
	}
	if only != "" {
		if e := utils.ValidateNetworkName(only); e != nil {
			return nil, fmt.Errorf("network %q: %s", only, e.Msg)
		}
		if !isDir(filepath.Join(dataDir, only)) && !isDir(filepath.Join(dataDir, records.DirName, only)) {
			return nil, fmt.Errorf("network %q: no leases or records under %s", only, dataDir)
		}
		return []string{only}, checkDirs(dataDir, []string{only})
	}
	seen := map[string]bool{}
	for _, dir := range []string{dataDir, filepath.Join(dataDir, records.DirName)} {
		entries, err := os.ReadDir(dir)
		if err != nil && dir == dataDir {
			return nil, fmt.Errorf("read data dir: %w", err)
		}
		for _, e := range entries {
			if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && utils.ValidateNetworkName(e.Name()) == nil {
				seen[e.Name()] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, checkDirs(dataDir, out)
}

// checkDirs refuses symlinked or foreign-owned directories, exactly as the
// CNI verbs do, before a command reads or releases anything in them.
func checkDirs(dataDir string, networks []string) error {
	for _, n := range networks {
		if err := (&ipamdir.Config{Name: n, DataDir: dataDir}).CheckDirs(); err != nil {
			return fmt.Errorf("unsafe data directory: %w", err)
		}
	}
	return nil
}

func isDir(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.IsDir()
}
