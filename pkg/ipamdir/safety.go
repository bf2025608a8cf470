package ipamdir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// CheckDirs refuses directories someone else could have planted: the
// dataDir itself (its last component: /var/run is a symlink to /run on most
// distributions, which is fine), host-local's network directory and the
// wrapper's record directories must each be a real directory, not a
// symlink, and owned by the user the plugin runs as. Missing ones are fine:
// they are created with the right owner. Run it before touching anything.
func (c *Config) CheckDirs() error {
	for _, dir := range []string{
		c.DataDir,
		c.NetworkDir(),
		filepath.Join(c.DataDir, records.DirName),
		filepath.Join(c.DataDir, records.DirName, c.Name),
	} {
		if err := checkOwnDir(dir); err != nil {
			return err
		}
	}
	return nil
}

func checkOwnDir(dir string) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("inspect %s: %w", dir, err)
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("refusing %s: it is a symlink (a directory the plugin writes must not point elsewhere)", dir)
	case !fi.IsDir():
		return fmt.Errorf("refusing %s: it is not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("refusing %s: owned by uid %d, not by uid %d that runs the plugin", dir, st.Uid, os.Geteuid())
	}
	return nil
}
