// Command syskill runs a program under ptrace and SIGKILLs it and every
// process and thread it started at the K-th system call of chosen classes,
// counted over the whole process tree, before that call runs. It is how
// the crash tests kill at points the code did not choose (test/e2e's
// syskill_test.go); test-only, never installed.
//
//	syskill [-k K] [-calls unlink,rename,create,write,flock,nlsend,exec]
//	        [-report FILE] [-log FILE] -- PROGRAM ARGS...
//
// strace's inject=…:when=K counts per thread (and every child starts its
// own count), so with Go's changing threads a K ≥ 2 mostly never fires;
// this counts once for the whole tree.
//
// With -k 0 it only counts. syskill returns once every process of the
// tree is gone and reaped (it is their subreaper). The exit status is the
// program's (128+signal if a signal ended it), or 137 if syskill killed
// it. -report writes {"killed":…,"count":…,"at":{…},"byClass":{…}}: count
// is K when killed, else every counted call. -log writes one JSON line per
// counted call, like "at" with its number k.
//
// What counts, at syscall entry (amd64 numbers):
//
//	unlink  unlink, unlinkat (AT_REMOVEDIR too; rmdir is not counted)
//	rename  rename, renameat, renameat2
//	create  open, openat, openat2 with O_CREAT; creat
//	write   write, pwrite64, writev: every fd, stdout and stderr too (a
//	        runtime that dies while logging is a crash like any other, and
//	        a filter by fd type would be one more guess)
//	flock   flock; fcntl F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW
//	nlsend  sendto, sendmsg on a socket whose SO_DOMAIN is AF_NETLINK
//	        (asked of a copy of the fd, pidfd_getfd: the socket may belong
//	        to another network namespace than the thread's current one)
//	exec    execve, execveat (the program's own first exec is done before
//	        tracing starts and is not counted)
//
// The count is as deterministic as the program: the same run gives about
// the same count, but goroutine scheduling shifts it (the Go runtime's
// netpoll wake-ups are writes to an eventfd, a syscall interrupted and
// restarted enters twice), so the K-th call of two runs may differ; the
// report says which call it was.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
)

// classes are the call classes, in the order -calls lists them.
var classes = []string{"unlink", "rename", "create", "write", "flock", "nlsend", "exec"}

// hit is one counted call.
type hit struct {
	K      int    `json:"k,omitempty"` // its number, in -log's lines
	PID    int    `json:"pid"`         // the thread group, as kill -9 would name it
	TID    int    `json:"tid"`
	Comm   string `json:"comm"`
	Call   string `json:"call"`
	Class  string `json:"class"`
	Detail string `json:"detail"`
}

type report struct {
	Killed  bool           `json:"killed"`
	Count   int            `json:"count"`
	At      *hit           `json:"at,omitempty"`
	ByClass map[string]int `json:"byClass"`
}

// options are what the tracer needs from the command line.
type options struct {
	k     int
	calls map[string]bool
	log   *json.Encoder
	argv  []string
}

func main() { os.Exit(runMain(os.Args[1:])) }

func runMain(args []string) int {
	fs := flag.NewFlagSet("syskill", flag.ContinueOnError)
	k := fs.Int("k", 0, "SIGKILL the whole tree at the K-th counted call (0: only count)")
	calls := fs.String("calls", strings.Join(classes, ","), "classes of calls to count")
	reportPath := fs.String("report", "", "write a JSON report to this file")
	logPath := fs.String("log", "", "write one line per counted call to this file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	o := options{k: *k, calls: map[string]bool{}, argv: fs.Args()}
	for c := range strings.SplitSeq(*calls, ",") {
		if !slices.Contains(classes, c) {
			fmt.Fprintf(os.Stderr, "syskill: unknown class %q (classes: %s)\n", c, strings.Join(classes, ","))
			return 2
		}
		o.calls[c] = true
	}
	if o.k < 0 || len(o.argv) == 0 {
		fmt.Fprintln(os.Stderr, "usage: syskill [-k K] [-calls CLASSES] [-report FILE] [-log FILE] -- PROGRAM ARGS...")
		return 2
	}
	if *logPath != "" {
		f, err := os.Create(*logPath)
		if err != nil {
			fmt.Fprintln(os.Stderr, "syskill:", err)
			return 2
		}
		defer f.Close()
		o.log = json.NewEncoder(f)
		o.log.SetEscapeHTML(false)
	}
	rep, code, err := trace(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "syskill:", err)
		return 2
	}
	if *reportPath != "" {
		var b strings.Builder
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false) // "a -> b" as written
		_ = enc.Encode(rep)
		if err := os.WriteFile(*reportPath, []byte(b.String()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "syskill:", err)
			return 2
		}
	}
	return code
}
