//go:build crashpoints

package crashpoint

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
)

// In a build with -tags crashpoints (tests only), Step counts the process's
// state changes; the NBC_CRASH_AT-th one is not made: the process kills
// itself with SIGKILL first, as kill -9 would at that point. Every step is
// appended to the file NBC_CRASH_LOG, when set, as "<k> <what>", so a test
// learns how many steps a path has from an unkilled run.
var (
	load   sync.Once
	killAt int64
	log    *os.File
	steps  atomic.Int64
)

func Step(what string) {
	load.Do(func() {
		killAt, _ = strconv.ParseInt(os.Getenv("NBC_CRASH_AT"), 10, 64)
		if path := os.Getenv("NBC_CRASH_LOG"); path != "" {
			log, _ = os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		}
	})
	k := steps.Add(1)
	if log != nil {
		fmt.Fprintf(log, "%d %s\n", k, what)
	}
	if k == killAt {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}
