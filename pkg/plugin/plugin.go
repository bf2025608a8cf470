// Package plugin implements the CNI verbs of nomad-bridge-cni: each one
// parses the entry, rewrites it for host-local's tmpfs dataDir and hands it
// to the delegate (bridge) through invoke.Delegate*.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/eventlog"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netconf"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// Plugin carries the edges the verbs talk through, so tests can replace the
// delegate's process with a fake and capture what we print.
type Plugin struct {
	// Exec finds and runs delegates (delegateExec, or a test's fake), or
	// has them inherit a file (see delegateExec.Inheriting).
	Exec interface {
		invoke.Exec
		Inheriting(*os.File) invoke.Exec
	}
	// Stdout receives the CNI result and nothing else.
	Stdout io.Writer
	// Reclaim is what the records and sweeps work through; its Log, the
	// operator's diagnostics, gets the verbs' warnings too.
	Reclaim reclaim.Env
	// onTmpfs tells whether a dataDir lives in memory; nil means statfs
	// (ipamdir.Dir.OnTmpfs). Tests replace it.
	onTmpfs func(ipamdir.Dir) (bool, int64, error)
}

// New returns a Plugin wired to the real process, before pkg/skel sets
// the process's CNI_NETNS_OVERRIDE (see EnvNetnsOverride).
func New() *Plugin {
	override, set := os.LookupEnv(EnvNetnsOverride)
	return &Plugin{
		Exec:    &delegateExec{stderr: os.Stderr, depth: DelegationDepth(), netnsOverride: override, netnsOverrideSet: set},
		Stdout:  os.Stdout,
		Reclaim: reclaim.NewEnv(os.Stderr),
	}
}

// Funcs lists the verbs for skel.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.verb("add", p.add), Del: p.verb("del", p.del), Check: p.verb("check", p.check), Status: p.verb("status", p.status), GC: p.verb("gc", p.gc)}
}

// verb is the CNI verb v as skel calls it: it parses the entry, once,
// refuses the plugin's own namespace, whatever the verb, and runs v on the
// entries the plugin manages, with the entry's log file when it names one;
// every other entry goes to the delegate as it came (see netconf.Config's
// Passthrough). It calls v itself, so that one frame of ours lies between
// skel and the verb.
func (p *Plugin) verb(name string, v func(*skel.CmdArgs, *netconf.Config) error) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) error {
		conf, err := netconf.Parse(args.StdinData)
		if err != nil {
			return err
		}
		// Parsing changes nothing; the refusal comes before anything else
		// does, and is logged like the verb's own.
		end := p.logTo(name, args, conf)
		depth := DelegationDepth()
		err = p.refuseOwnNamespace(args.Netns)
		switch {
		case err != nil:
		case depth >= MaxDelegationDepth:
			err = types.NewError(types.ErrInvalidNetworkConfig,
				fmt.Sprintf("nomad-bridge-cni (%s) was called through %d copies of itself: copies in CNI_PATH %q call one another (installed twice as %q, or behind a script of that name?); refused so that they do not call each other without end: keep one copy in front of the reference plugins", conf.Type, depth, os.Getenv("CNI_PATH"), conf.Delegate), "")
		case conf.Passthrough || (conf.Type == conf.Delegate && depth > 0):
			// Installed under its delegate's name and called by the
			// plugin itself (both install modes on one host): the
			// caller does the work, this copy is the delegate's stand-in.
			err = p.passThrough(name, conf, args.StdinData)
		default:
			err = v(args, conf)
		}
		return end(err)
	}
}

// logTo opens the entry's log file, if it names one, for the verb name:
// until the returned end is called with the verb's outcome, what the verb
// writes to stderr goes there too, one JSON line each; end logs the
// outcome (the refusal, or done), and returns it. Without a log file, end
// returns the outcome and does nothing else.
func (p *Plugin) logTo(name string, args *skel.CmdArgs, conf *netconf.Config) (end func(error) error) {
	if conf.LogFile == "" {
		return func(err error) error { return err }
	}
	log, err := eventlog.Open(conf.LogFile, conf.LogLevel, eventlog.Attachment{
		Command: strings.ToUpper(name), Network: conf.Name, ContainerID: args.ContainerID, IfName: args.IfName, Netns: args.Netns})
	if err != nil {
		p.Reclaim.Logf("warning: %v; nothing is logged there", err)
		return func(err error) error { return err }
	}
	stderr := p.Reclaim.Log
	p.Reclaim.Log = log
	if stderr != nil {
		p.Reclaim.Log = io.MultiWriter(stderr, log)
	}
	log.Event(eventlog.Debug, "start", name, nil)
	return func(verr error) error {
		var cniErr *types.Error
		switch {
		case errors.As(verr, &cniErr):
			log.Event(eventlog.Error, "refusal", cniErr.Msg, map[string]any{"code": cniErr.Code, "details": cniErr.Details})
		case verr != nil:
			log.Event(eventlog.Error, "refusal", verr.Error(), nil)
		default:
			log.Event(eventlog.Debug, "done", name, nil)
		}
		p.Reclaim.Log = stderr
		log.Close()
		return verr
	}
}

// load makes sure the entry's delegate can be found and its directories
// are safe, and renders the delegate's entry, before any verb touches the
// filesystem.
func (p *Plugin) load(conf *netconf.Config) ([]byte, error) {
	if err := p.find(conf.Delegate); err != nil {
		return nil, err
	}
	if err := conf.Dir().Check(); err != nil {
		return nil, types.NewError(types.ErrIOFailure, "unsafe data directory", err.Error())
	}
	return conf.DelegateConfig()
}

// loadForHostLocal is load for a verb whose delegate runs host-local on
// the network's directory. host-local opens its lock and reads every lease
// blocking and through links: a planted FIFO would hang the verb until
// delegateTimeout, so such a directory is refused first.
func (p *Plugin) loadForHostLocal(conf *netconf.Config) ([]byte, error) {
	delegateConf, err := p.load(conf)
	if err != nil {
		return nil, err
	}
	if err := conf.Dir().CheckPlanted(); err != nil {
		return nil, plantedError(err)
	}
	return delegateConf, nil
}

// scratchConfig is the delegate's entry with host-local's dataDir an
// empty directory of this verb's own (0700, out of the data dir, where
// nothing can be planted in it beforehand), which cleanup removes: for a
// verb that must not run host-local on the network's directory.
func scratchConfig(conf *netconf.Config, verb string) (delegateConf []byte, cleanup func(), err error) {
	scratch, err := os.MkdirTemp("", "nomad-bridge-cni-"+verb+"-")
	if err != nil {
		return nil, nil, types.NewError(types.ErrIOFailure, "failed to make a directory for host-local's "+strings.ToUpper(verb), err.Error())
	}
	cleanup = func() { os.RemoveAll(scratch) }
	if delegateConf, err = conf.DelegateConfigWithDataDir(scratch); err != nil {
		cleanup()
		return nil, nil, err
	}
	return delegateConf, cleanup, nil
}

func plantedError(err error) error {
	return types.NewError(types.ErrIOFailure, "refusing to run host-local: "+err.Error(), "")
}

// find resolves a plugin in CNI_PATH exactly as invoke.Delegate* will (it
// reads the process environment too), so a missing delegate is reported as
// a configuration problem up-front rather than after we have written state.
func (p *Plugin) find(plugin string) error {
	cniPath := os.Getenv("CNI_PATH")
	_, err := p.Exec.FindInPath(plugin, filepath.SplitList(cniPath))
	if err == nil {
		return nil
	}
	msg := fmt.Sprintf("plugin %q not found in CNI_PATH %q: install the reference CNI plugins there or set \"delegate\"", plugin, cniPath)
	if errors.Is(err, ErrOnlySelf) {
		msg = fmt.Sprintf("\"delegate\" %q names this plugin itself: no other %q in CNI_PATH %q; install the reference plugins in a directory listed after this plugin's", plugin, plugin, cniPath)
	}
	return types.NewError(types.ErrInvalidNetworkConfig, msg, err.Error())
}

// delegateError keeps the delegate's CNI error code (the runtime may act on
// it, e.g. 11 "try again later") and says which plugin and verb failed.
func delegateError(ctx context.Context, plugin, verb string, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		deadline, _ := ctx.Deadline()
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("delegate %s did not answer %s in time and was killed (deadline %s; see \"delegateTimeout\")", plugin, verb, deadline.UTC().Format("15:04:05")), err.Error())
	}
	if cniErr := answer(err); cniErr != nil {
		return types.NewError(cniErr.Code, fmt.Sprintf("delegate %s failed (%s): %s", plugin, verb, cniErr.Msg), cniErr.Details)
	}
	return types.NewError(types.ErrInternal, fmt.Sprintf("delegate %s failed (%s) without a CNI error: it crashed or was killed", plugin, verb), err.Error())
}

// answer is the CNI error a delegate printed, or nil if it printed none
// (code 0 is what invoke makes of output it could not parse). A delegate
// that answered ran its own deferred undo: bridge's failed ADD releases its
// IPAM allocation and spoof-check rules, but leaves a veth it made in the
// namespace and ipMasq rules it set up. ADD then sends bridge no DEL: it
// would delete CNI_IFNAME in the namespace, which may be another
// attachment's when bridge refused because it exists. Abort releases the
// NAT rules and leases. Anything else (a crash, a kill, a timeout) may
// have left an allocation behind.
func answer(err error) *types.Error {
	var cniErr *types.Error
	if errors.As(err, &cniErr) && cniErr.Code != 0 {
		return cniErr
	}
	return nil
}

// migrate moves legacy leases into the dataDir once per boot. Its failure
// is an error for ADD: allocating before the move could hand out an
// address a running container still holds.
func (p *Plugin) migrate(conf *netconf.Config) error {
	if err := (&reclaim.Migrator{Env: p.Reclaim}).Migrate(conf.Dir(), conf.LegacyDataDir); err != nil {
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("failed to migrate leases from %s", conf.LegacyDataDir), err.Error())
	}
	return nil
}

func attachmentKey(args *skel.CmdArgs) records.Key {
	return records.Key{ContainerID: args.ContainerID, IfName: args.IfName}
}

// delegateCtx bounds one delegate call by the entry's delegateTimeout (see
// netconf.DefaultDelegateTimeout): a hung bridge is killed.
func delegateCtx(conf *netconf.Config) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), conf.DelegateTimeout)
}
