package reclaim

import (
	"fmt"
	"io"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

// Env is what reclaim works through: the host (namespaces, processes, boot
// ID, clock), the NAT tables, and the log. Each job has its own type over
// it: Sweeper (sweeps), Attacher (the records around ADD and DEL) and
// Migrator (legacy leases).
type Env struct {
	Host sysinfo.Host
	// Netfilter releases NAT rules; nil leaves them alone.
	Netfilter *netfilter.Cleaner
	// Log gets one line per release and per problem; nil discards.
	Log io.Writer
}

// NewEnv is the real host's: its namespaces, processes and clock, its NAT
// tables, and log (nil discards). The plugin and the operator's commands
// are wired through it alike.
func NewEnv(log io.Writer) Env {
	host, nat := &sysinfo.Real{}, netfilter.New()
	nat.Running = host.CNIProcesses
	return Env{Host: host, Netfilter: nat, Log: log}
}

// Logf writes one line: what it says of files and processes is
// statefile.Printable, so that a planted name cannot forge a line of the
// runtime's log, nor reach a terminal raw.
func (e *Env) Logf(format string, args ...any) {
	if e.Log != nil {
		fmt.Fprintf(e.Log, "nomad-bridge-cni: %s\n", statefile.Printable(fmt.Sprintf(format, args...)))
	}
}

func (e *Env) running(pid int) bool {
	_, ok := e.Host.ProcessStart(pid)
	return ok
}
