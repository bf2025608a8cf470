package plugin

import (
	"testing"

	"golang.org/x/sys/unix"
)

func tmpfsOf(t *testing.T, dir string) (bool, int64, error) {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, 0, err
	}
	return st.Type == unix.TMPFS_MAGIC, st.Type, nil
}
