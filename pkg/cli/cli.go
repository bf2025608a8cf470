// Package cli is the operator's command line: the same binary run by hand
// (no CNI_COMMAND) with a subcommand or a flag. It wires the commands'
// flags to pkg/operator (leases, gc), pkg/doctor and pkg/metrics.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/utils"
	"github.com/spf13/pflag"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/conflists"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/operator"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/runtimes"
)

const usage = `nomad-bridge-cni: a CNI plugin that wraps "bridge" and keeps host-local's
leases on tmpfs, so containers restored after a reboot get their address back.

As a CNI plugin it is run by the container runtime (CNI_COMMAND set). Put it in
your CNI bin directory (/opt/cni/bin) and change one word in a conflist:
  "type": "bridge"  ->  "type": "nomad-bridge-cni"

Usage:
  nomad-bridge-cni                  print the version line and exit
  nomad-bridge-cni --version        print the version line and exit
  nomad-bridge-cni leases [flags]   who holds which address, and which holders are dead
  nomad-bridge-cni gc [flags]       release dead holders now (what CHECK does)
  nomad-bridge-cni doctor [flags]   check this host's install, config and state
  nomad-bridge-cni metrics [flags]  the networks' state for Prometheus (textfile collector)
  nomad-bridge-cni <command> -h     help for a command

Flags:
`

const leasesUsage = `Usage: nomad-bridge-cni leases [--data-dir D] [--network N] [--conf-dir DIR]... [--runtime R] [--json]

One row per lease: network, IP, container ID, ifname, netns path, age, and
state: live, stale (<reason>), pending (ADD in progress), detached (its
namespace path was replaced or removed, but a process or mount still holds the
namespace: kept, and a re-ADD is refused), unknown (no record).
NAT rules (bridge ipMasq, portmap) that no lease or record holds are listed as
orphan-rules. Networks by name, each in the order its sweep meets them
(attachments with a record first; see docs/operator.md). Changes nothing.
--runtime podman|nomad|cri marks each row the runtime does not list ("not listed by the
runtime"; in JSON, "runtime": "listed" or "not listed"), then names the
containers it lists that hold nothing on these networks (on stderr with
--json).

Examples:
  nomad-bridge-cni leases
  nomad-bridge-cni leases --network nomad --json | jq '.leases[] | select(.state=="stale")'

Flags:
`

const gcUsage = `Usage: nomad-bridge-cni gc [--data-dir D | --all-data-dirs] [--network N] [--conf-dir DIR]... [--runtime R [--grace D] [--remove-mounts]] [--dry-run] [--orphan-rules] [--json]

Runs exactly what a CNI CHECK runs after its delegate: the migration of the
network's legacy leases (once per boot; from the ipam.dataDir its conflist
names, else /var/lib/cni/networks), then the sweep, under host-local's lock,
remembered as the network's last sweep. It prints each release and why: leases, bridge's ipMasq rules, portmap's chain and the
record of every attachment proved stale (earlier boot, namespace gone or
replaced), and the NAT rules of containers that hold neither a lease nor a
record on a network an ADD through the plugin marked as its own.
--orphan-rules releases those on an unmarked network too (a data dir the
plugin used before it marked networks): only where you know the network's
rules are the plugin's. Whatever the flags, a container that holds a lease
or record in another data dir (the default one, the legacy one, or one that
a conflist in the runtimes' directories or in --conf-dir uses) keeps its
rules. --all-data-dirs sweeps --data-dir and every dataDir that the
host's conflists (and --conf-dir) give the plugin, one after the other; a
data dir that does not exist holds nothing: what the packaged timer and boot
sweep run. --runtime podman|nomad|cri also asks the runtime what it runs
(podman ps; the local Nomad agent's API through nomad operator api, which
reads NOMAD_ADDR and NOMAD_TOKEN; crictl pods, for containerd and CRI-O): an attachment of a container it does not list is released once it is
older than --grace and was missing from a list taken at least --grace before
(gc remembers each run's list), even while a leaked mount keeps its
namespace alive (the mount is named; --remove-mounts unmounts it); never one a process still
holds, nor a pending ADD's. Nothing is released when the runtime cannot be
asked. Exit status 0 on success, 1 when a network could not be swept (or the
runtime not asked); --json then still prints its document, and one that
could not start at all (no data dir listed, no runtime asked) says why in
"error".

Examples:
  nomad-bridge-cni gc --dry-run
  nomad-bridge-cni gc --all-data-dirs
  nomad-bridge-cni gc --runtime podman --grace 10m
  nomad-bridge-cni gc --network nomad
  nomad-bridge-cni gc --orphan-rules --json

Flags:
`

// cli holds the operator CLI's edges, so tests can give it a fake host.
type cli struct {
	stdout, stderr io.Writer
	sweeper        func() *reclaim.Sweeper
	about          string
}

// Run is the operator's entry point: flags and subcommands, never the CNI
// protocol. about is the version line --version prints.
func Run(args []string, stdout, stderr io.Writer, about string) int {
	sweeper := func() *reclaim.Sweeper { return &reclaim.Sweeper{Env: reclaim.NewEnv(nil)} }
	return (&cli{stdout: stdout, stderr: stderr, sweeper: sweeper, about: about}).run(args)
}

func (c *cli) run(args []string) int {
	commands := map[string]func(args []string) int{"leases": c.leases, "gc": c.gc, "doctor": c.doctor, "metrics": c.metrics}
	if len(args) > 0 && commands[args[0]] != nil {
		return commands[args[0]](args[1:])
	}
	flags := c.flagSet("", usage)
	showVersion := flags.Bool("version", false, "print the version line and exit")
	if code, done := c.parse(flags, args); done {
		return code
	}
	if *showVersion {
		fmt.Fprintln(c.stdout, c.about)
		return 0
	}
	if flags.NArg() > 0 {
		return c.fail(2, fmt.Errorf("unknown command %q", flags.Arg(0)), "")
	}
	flags.usage(c.stderr)
	return 2
}

type commonFlags struct {
	dataDir, network string
	json             bool
}

func (c *cli) common(flags *command) *commonFlags {
	f := &commonFlags{}
	flags.StringVar(&f.dataDir, "data-dir", ipamdir.DefaultDataDir, "the plugin's dataDir")
	flags.StringVar(&f.network, "network", "", "only this network (default: every network under the data dir)")
	flags.BoolVar(&f.json, "json", false, "print JSON instead of text")
	flags.confDirFlag("also read the conflists here, for the data dirs they use (repeatable)")
	return f
}

// hostNetworks are the networks of the host's conflists (and extra's):
// a command's scope takes from them the data dirs they use (a sweep of one
// data dir never takes the NAT rules of another's containers for orphans)
// and the networks' legacy dirs (gc migrates from them, as CHECK does). A
// "type": "bridge" entry is the plugin's, installed as bridge, where the
// plugin proved it served it (reclaim.Owns, in the entry's data dir);
// else bare bridge's.
func hostNetworks(extra []string) []*conflists.Network {
	dirs := append(slices.Clone(conflists.DefaultDirs), extra...)
	asPlugin := conflists.Networks(conflists.Read(dirs, true))
	nets := conflists.Networks(conflists.Read(dirs, false))
	for i, n := range nets {
		j := slices.IndexFunc(asPlugin, func(p *conflists.Network) bool { return p.File == n.File && p.Entry == n.Entry })
		if !n.Ours && j >= 0 && asPlugin[j].Ours && reclaim.Owns(asPlugin[j].Dir) {
			nets[i] = asPlugin[j]
		}
	}
	return nets
}

func (c *cli) leases(args []string) (code int) {
	flags := c.flagSet("leases", leasesUsage)
	f := c.common(flags)
	runtime := flags.String("runtime", "", "mark what this runtime ("+strings.Join(runtimes.Names, ", ")+") does not list, and name what it lists that holds nothing here")
	if code, done := c.parse(flags, args); done {
		return code
	}
	// Its document is printed even when it cannot start (exit 1).
	cannotStart := func(code int, err error) int {
		if f.json && code == 1 {
			_ = operator.LeasesJSONFailed(c.stdout, f.dataDir, err)
		}
		return code
	}
	var listing *runtimes.Listing
	if *runtime != "" {
		var err error
		if listing, code, err = c.askRuntime(*runtime, "leases"); listing == nil {
			return cannotStart(code, err)
		}
	}
	dirs, skipped, err := ipamdir.List(f.dataDir, f.network)
	if err != nil {
		return cannotStart(c.fail(1, err, ""), err)
	}
	defer c.reportSkipped(skipped, &code)
	var sink operator.LeasesSink = operator.NewLeasesTable(c.stdout)
	note := c.stdout
	if f.json {
		sink, note = operator.NewLeasesJSON(c.stdout, f.dataDir), c.stderr
	}
	if listing != nil {
		sink = &operator.Drift{Sink: sink, Runtime: *runtime, Listing: listing, Note: note}
	}
	if err := operator.Leases(c.sweeper(), operator.NewScope(f.dataDir, dirs, hostNetworks(*flags.confDirs)), sink); err != nil {
		return c.fail(1, err, "")
	}
	return 0
}

// reportSkipped says, after the others were done, which networks were
// skipped and why; any makes the command fail.
func (c *cli) reportSkipped(skipped []error, code *int) {
	for _, err := range skipped {
		*code = max(*code, c.fail(1, err, ""))
	}
}

func (c *cli) gc(args []string) (code int) {
	flags := c.flagSet("gc", gcUsage)
	f := c.common(flags)
	dryRun := flags.Bool("dry-run", false, "change nothing; print what would be released")
	orphans := flags.Bool("orphan-rules", false, "release NAT rules that no lease or record holds even on a network no ADD through the plugin marked as its own")
	allDataDirs := flags.Bool("all-data-dirs", false, "sweep --data-dir and every dataDir the host's conflists give the plugin (one that does not exist holds nothing)")
	runtime := flags.String("runtime", "", "also release what this runtime ("+strings.Join(runtimes.Names, ", ")+") no longer lists, past --grace")
	grace := flags.Duration("grace", operator.DefaultGrace, "with --runtime: how old an unlisted attachment must be, and how long it must have been missing")
	removeMounts := flags.Bool("remove-mounts", false, "with --runtime: also unmount the nsfs mount that alone kept a released attachment's namespace")
	if code, done := c.parse(flags, args); done {
		return code
	}
	if *allDataDirs && f.json {
		return c.fail(2, errors.New("--json prints one data dir's document: run gc --json --data-dir D for each data dir"), "gc")
	}
	var rec *operator.Reconcile
	if *runtime == "" {
		// Accepted silently, they would read as in force.
		for _, name := range []string{"grace", "remove-mounts"} {
			if flags.Changed(name) {
				return c.fail(2, fmt.Errorf("--%s is only meaningful with --runtime", name), "gc")
			}
		}
	} else {
		if *grace < time.Minute {
			return c.fail(2, fmt.Errorf("--grace %s: at least 1m (a runtime's list lags behind its ADDs)", *grace), "gc")
		}
		listing, code, err := c.askRuntime(*runtime, "gc")
		if listing == nil {
			if f.json && code == 1 {
				// Its document is printed even when it cannot start.
				_ = operator.GCJSONFailed(c.stdout, f.dataDir, *dryRun, err)
			}
			return code
		}
		rec = &operator.Reconcile{Runtime: *runtime, Listing: listing, Grace: *grace, Now: time.Now(), RemoveMounts: *removeMounts}
	}
	nets := hostNetworks(*flags.confDirs)
	dataDirs := []string{f.dataDir}
	if *allDataDirs {
		dataDirs = conflists.PluginDataDirs(f.dataDir, nets)
	}
	var skipped []error
	defer func() { c.reportSkipped(skipped, &code) }()
	for _, dataDir := range dataDirs {
		if *allDataDirs {
			if _, err := os.Stat(dataDir); errors.Is(err, fs.ErrNotExist) {
				fmt.Fprintf(c.stdout, "data dir %s: does not exist, nothing to sweep\n", statefile.Printable(dataDir))
				continue
			}
			fmt.Fprintf(c.stdout, "data dir %s:\n", statefile.Printable(dataDir))
		}
		dirs, skippedHere, err := ipamdir.List(dataDir, f.network)
		if *allDataDirs && errors.Is(err, ipamdir.ErrNotServed) {
			err = nil // a data dir without the network holds nothing of it
		}
		if err != nil {
			// The others are still swept; the failure is the exit status.
			code = c.fail(1, err, "")
			if f.json {
				// Its document is printed even when it cannot start
				// (--json takes one data dir).
				_ = operator.GCJSONFailed(c.stdout, dataDir, *dryRun, err)
			}
			continue
		}
		skipped = append(skipped, skippedHere...)
		var sink operator.GCSink = operator.NewGCText(c.stdout, *dryRun)
		if f.json {
			sink = operator.NewGCJSON(c.stdout, dataDir, *dryRun)
		}
		if err := operator.GC(c.sweeper(), operator.NewScope(dataDir, dirs, nets), *dryRun, *orphans, rec, sink); err != nil {
			code = c.fail(1, err, "")
		}
	}
	return code
}

// askRuntime lists what the runtime runs, for cmd's --runtime; nil, the
// exit status (2: no such runtime; 1: not reachable) and the error it
// printed when it cannot.
func (c *cli) askRuntime(name, cmd string) (*runtimes.Listing, int, error) {
	lister, err := runtimes.New(name)
	if err != nil {
		return nil, c.fail(2, err, cmd), err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	listing, err := lister.List(ctx)
	if err != nil {
		err = fmt.Errorf("cannot ask %s what it runs, so nothing is done on its account: %w", name, err)
		return nil, c.fail(1, err, ""), err
	}
	return listing, 0, nil
}

// checkConfDirs refuses a --conf-dir that is not a directory: a typo must
// not read as a host with nothing to report.
func checkConfDirs(dirs []string) error {
	for _, d := range dirs {
		fi, err := os.Stat(d)
		switch {
		case err != nil:
			return fmt.Errorf("--conf-dir %s: %w", d, err)
		case !fi.IsDir():
			return fmt.Errorf("--conf-dir %s: not a directory", d)
		}
	}
	return nil
}

// command is a flag set, the help text printed before its flags, and its
// --conf-dir flag's value, if it has one.
type command struct {
	*pflag.FlagSet
	help     string
	confDirs *[]string
}

// confDirFlag adds the --conf-dir flag, which parse checks.
func (cmd *command) confDirFlag(help string) *[]string {
	cmd.confDirs = cmd.StringArray("conf-dir", nil, help)
	return cmd.confDirs
}

func (c *cli) flagSet(name, help string) *command {
	flags := pflag.NewFlagSet(conflists.PluginName+" "+name, pflag.ContinueOnError)
	// pflag would print errors and usage itself while parsing; parse does
	// it once, on the right stream.
	flags.SetOutput(io.Discard)
	return &command{FlagSet: flags, help: help}
}

func (cmd *command) usage(w io.Writer) {
	fmt.Fprint(w, cmd.help)
	fmt.Fprint(w, cmd.FlagUsages())
}

// parse handles -h (usage on stdout, exit 0), and bad flags, arguments
// given to a subcommand, a --conf-dir that is not a directory and a
// --network no CNI network can have (exit 2), before any is acted on.
func (c *cli) parse(flags *command, args []string) (int, bool) {
	name := strings.TrimSpace(strings.TrimPrefix(flags.Name(), conflists.PluginName))
	err := flags.Parse(args)
	switch {
	case errors.Is(err, pflag.ErrHelp):
		flags.usage(c.stdout)
		return 0, true
	case err == nil && name != "" && flags.NArg() > 0:
		err = fmt.Errorf("%s takes no arguments, got %q", name, flags.Args())
	case err == nil && flags.confDirs != nil:
		err = checkConfDirs(*flags.confDirs)
	}
	if network := flags.Lookup("network"); err == nil && network != nil && network.Changed {
		if e := utils.ValidateNetworkName(network.Value.String()); e != nil {
			err = fmt.Errorf("--network %q: %s", network.Value, e.Msg)
		}
	}
	if err != nil {
		return c.fail(2, err, name), true
	}
	return 0, false
}

// fail prints err, and for a usage error (code 2) where cmd's help is.
func (c *cli) fail(code int, err error, cmd string) int {
	fmt.Fprintf(c.stderr, "nomad-bridge-cni: %s\n", statefile.Printable(err.Error()))
	if code == 2 {
		fmt.Fprintf(c.stderr, "Run '%s --help' for usage.\n", strings.TrimSpace(conflists.PluginName+" "+cmd))
	}
	return code
}
