package plugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// The plugin can be installed under its delegate's name: as `bridge`, in a
// plugin directory the runtime searches before the reference plugins'
// (Nomad's cni_path /opt/nbc/bin:/opt/cni/bin, podman's cni_plugin_dirs).
// Then every conflist's plain "type": "bridge" reaches it unchanged, and it
// must find the real bridge further along CNI_PATH: the lookup skips its own
// executable, compared as a file (device and inode), so a hard link or a
// symlink to it is recognised too.

// ErrOnlySelf is returned when every candidate is this plugin itself: it
// would call itself until the runtime's timeout.
var ErrOnlySelf = errors.New("names this plugin itself")

// FindDelegate is invoke.FindInPath past this plugin's own executable: the
// first regular file called name in dirs that is not this process's
// executable.
func FindDelegate(name string, dirs []string) (string, error) {
	if name == "" || strings.ContainsRune(name, os.PathSeparator) {
		return "", fmt.Errorf("invalid plugin name %q", name)
	}
	if len(dirs) == 0 {
		return "", errors.New("no plugin directories given (CNI_PATH is empty)")
	}
	self, err := selfIdentity()
	if err != nil {
		// Without it the plugin could pick itself and recurse.
		return "", err
	}
	sawSelf := false
	for _, dir := range dirs {
		path := filepath.Join(dir, name)
		var st unix.Stat_t
		if unix.Stat(path, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		if st.Dev == self.Dev && st.Ino == self.Ino {
			sawSelf = true
			continue
		}
		return path, nil
	}
	if sawSelf {
		return "", fmt.Errorf("%q %w: no other %q in %s", name, ErrOnlySelf, name, strings.Join(dirs, ":"))
	}
	return "", fmt.Errorf("failed to find plugin %q in path %s", name, dirs)
}

// selfIdentity is the device and inode of this process's executable.
func selfIdentity() (unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		return st, fmt.Errorf("identify own executable: %w", err)
	}
	return st, nil
}
