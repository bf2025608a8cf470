// Package operator implements the operator's commands: `leases` shows who
// holds which address and which holders are dead, `gc` runs CHECK's sweep
// by hand. Both read the same state, through the same code, as the plugin.
package operator

import "github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netdir"

// Networks names the networks under dataDir (only that one, when set),
// each checked as the CNI verbs check it, and says why it skipped the
// ones that failed (netdir.List).
func Networks(dataDir, only string) (names []string, skipped []error, err error) {
	dirs, skipped, err := netdir.List(dataDir, only)
	if err != nil {
		return nil, nil, err
	}
	names = make([]string, len(dirs))
	for i, d := range dirs {
		names[i] = d.Network
	}
	return names, skipped, nil
}
