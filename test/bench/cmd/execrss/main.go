// Command execrss runs a program and prints "<wall ns> <peak RSS KiB>
// <CPU ns>" of it, from wait4's rusage (CPU is user + system time of the
// program and of the children it waited for).
//
// A child started by a large Go process cannot be measured directly:
// os/exec starts children with clone(CLONE_VM|CLONE_VFORK), and at execve
// the kernel folds the high-water RSS of the mm the child leaves — the
// parent's, shared — into the child's ru_maxrss. This tiny program is the
// parent instead, so only its own RSS (about 1-2 MiB; nbcbench measures it
// on /bin/true and reports it as the floor) can leak into the number.
package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: execrss PROG [ARGS...]")
		os.Exit(2)
	}
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	t0 := time.Now()
	err := cmd.Run()
	wall := time.Since(t0)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v: %s\n", strings.Join(os.Args[1:], " "), err, strings.TrimSpace(stderr.String()))
		os.Exit(1)
	}
	var rss, cpu int64
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		rss = ru.Maxrss
		cpu = ru.Utime.Nano() + ru.Stime.Nano()
	}
	fmt.Printf("%d %d %d\n", wall.Nanoseconds(), rss, cpu)
}
