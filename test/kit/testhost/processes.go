package testhost

import (
	"os"
	"path/filepath"
	"strconv"
)

// Processes lists the pids of this host's processes (not this one) for
// which match, given the pid and a reader of its /proc files ("environ",
// "cmdline", ...), says yes. A process that exits meanwhile reads as
// nothing.
func Processes(match func(pid int, read func(name string) []byte) bool) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		read := func(name string) []byte {
			b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), name))
			return b
		}
		if match(pid, read) {
			pids = append(pids, pid)
		}
	}
	return pids
}
