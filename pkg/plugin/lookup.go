package plugin

import (
	"debug/buildinfo"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The plugin can be installed under its delegate's name: as `bridge`, in a
// plugin directory the runtime searches before the reference plugins'
// (Nomad's cni_path /opt/nbc/bin:/opt/cni/bin, podman's cni_plugin_dirs).
// Then every conflist's plain "type": "bridge" reaches it unchanged, and it
// must find the real bridge further along CNI_PATH: the lookup skips its own
// executable, compared as a file (device and inode), so a hard link or a
// symlink to it is recognised too.

// ErrOnlySelf is returned when every candidate is this plugin itself, or
// another copy of it: it would call itself until the runtime's timeout,
// and two copies would call each other without end.
var ErrOnlySelf = errors.New("names this plugin itself")

// mainPackage is the plugin's main package, as Go's build info names it in
// every copy of the binary, whatever its file is called.
const mainPackage = "github.com/nomad-bridge-cni/nomad-bridge-cni/cmd/nomad-bridge-cni"

// FindDelegate is invoke.FindInPath past this plugin: the first regular
// file called name in dirs that is neither this process's executable nor
// another copy of the plugin (see ErrOnlySelf). A copy is told by its
// build info (about 0.1 ms a candidate, one per verb: the lookup is
// remembered); a copy hidden behind a script is caught by the delegation
// depth (see EnvDelegating).
func FindDelegate(name string, dirs []string) (string, error) {
	if name == "" || strings.ContainsRune(name, os.PathSeparator) {
		return "", fmt.Errorf("invalid plugin name %q", name)
	}
	if len(dirs) == 0 {
		return "", errors.New("no plugin directories given (CNI_PATH is empty)")
	}
	self, err := os.Stat("/proc/self/exe")
	if err != nil {
		// Without it the plugin could pick itself and recurse.
		return "", fmt.Errorf("identify own executable: %w", err)
	}
	var copies []string
	for _, dir := range dirs {
		path := filepath.Join(dir, name)
		st, err := os.Stat(path)
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		if os.SameFile(st, self) || isPluginCopy(path) {
			copies = append(copies, path)
			continue
		}
		return path, nil
	}
	if len(copies) > 0 {
		return "", fmt.Errorf("%q %w: every %q in %s is nomad-bridge-cni (%s), none the delegate; keep one copy in front of the reference plugins", name, ErrOnlySelf, name, strings.Join(dirs, ":"), strings.Join(copies, ", "))
	}
	return "", fmt.Errorf("failed to find plugin %q in path %s", name, dirs)
}

// isPluginCopy reports whether the file at path is a build of the plugin.
func isPluginCopy(path string) bool {
	bi, err := buildinfo.ReadFile(path)
	return err == nil && bi.Path == mainPackage
}

// EnvDelegating carries, in the environment of the plugin's delegates,
// how many copies of the plugin called one another to get there: a copy
// started with it set was called by the plugin (a copy installed as
// `bridge` that an older version's lookup found), passes its entry on as
// it came, and never manages the network a second time. At
// MaxDelegationDepth the copies call each other (two copies, or one
// behind a script named like its delegate): refused, rather than a chain
// of processes with no end.
const EnvDelegating = "NOMAD_BRIDGE_CNI_DELEGATING"

// MaxDelegationDepth: the runtime calls the plugin (0), which may call a
// copy of itself that passes on (1); a copy called by that one is a loop.
const MaxDelegationDepth = 2

// DelegationDepth is how many copies of the plugin called this process.
func DelegationDepth() int {
	v := os.Getenv(EnvDelegating)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 1 // set by an older version, which wrote "1"
	}
	return n
}
