package plugin

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/conflists"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netconf"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
)

// add delegates ADD with host-local's dataDir rewritten and prints the
// delegate's result in the entry's cniVersion, so later plugins in the
// chain see exactly what bridge would have given them. Around it: legacy
// leases are migrated (once per boot), a stale earlier attachment of the
// same container ID + ifname is released (Nomad's re-ADD after a failed
// CHECK), and the attachment record is written pending before the
// delegate runs and completed after.
func (p *Plugin) add(args *skel.CmdArgs, conf *netconf.Config) (err error) {
	delegateConf, err := p.loadForHostLocal(conf)
	if err != nil {
		return err
	}
	if err := checkTarget(args); err != nil {
		return err
	}
	// A failed ADD on a network the plugin never served leaves nothing
	// (not even the marker that makes its NAT rules the plugin's), unless
	// what it made could not be undone (keep).
	was, keep := conf.Dir().Existing(), false
	defer func() {
		if err != nil && !keep {
			if rerr := conf.Dir().RemoveUnused(was); rerr != nil {
				p.Reclaim.Logf("warning: removing what the failed ADD created: %v", rerr)
			}
		}
	}()
	// Nothing is written before this: it checks the namespace first.
	// Its delegate, then maybe its rollback, each within delegateTimeout:
	// past that, a sweep ends what still runs of this ADD.
	bound := 2*conf.DelegateTimeout + addSlack
	attach, err := (&reclaim.Attacher{Env: p.Reclaim, AddBound: bound, LegacyDataDir: conf.LegacyDataDir}).BeginAdd(conf.Dir(), attachmentKey(args), args.Netns)
	if err != nil {
		return beginAddError(err)
	}
	// Complete and Abort drop the lock; this covers a record left pending
	// (a failed rollback) too.
	defer attach.Close()
	p.warnIfPersistent(conf)
	if err := p.migrate(conf); err != nil {
		if aerr := attach.Abort(); aerr != nil {
			p.Reclaim.Logf("warning: %v", aerr)
		}
		keep = true // what the migration moved
		return err
	}

	ctx, cancel := delegateCtx(conf)
	defer cancel()
	// The delegate and all it runs hold the record's lock: a sweep counts
	// the ADD as running while any of them does, even once we are killed.
	result, err := p.delegateAdd(ctx, args, conf, delegateConf, attach)
	if err != nil {
		addErr := delegateError(ctx, conf.Delegate, "add", err)
		if answer(err) == nil {
			// bridge crashed or was killed part-way: undo what it may have
			// done (lease, veth, rules) before dropping the record. If
			// that fails too, the pending record stays for a sweep.
			if derr := p.delegate(conf, "del", conf.Delegate, delegateConf, p.Exec); derr != nil {
				p.Reclaim.Logf("warning: rollback of the failed ADD of %s: %v", attach.Record.Key(), derr)
				keep = true
				return addErr
			}
		}
		if aerr := attach.Abort(); aerr != nil {
			p.Reclaim.Logf("warning: %v", aerr)
			keep = true
		}
		return addErr
	}
	if err := attach.Complete(resultIPs(result)); err != nil {
		// The attachment works; a pending record of a finished ADD is
		// judged by its namespace like a complete one.
		p.Reclaim.Logf("warning: %v", err)
	}
	return p.printResult(result, conf.CNIVersion)
}

// warnIfPersistent tells the operator that the dataDir will survive a
// reboot, which is the failure this plugin exists to prevent. It is a
// warning, not an error: /run is not tmpfs on every host, and the
// boot-aware GC still reclaims such leases. It is given once per boot and
// network (a marker next to the records), not on every ADD: a runtime
// such as Nomad logs the plugins' stderr, and the log would fill with it.
func (p *Plugin) warnIfPersistent(conf *netconf.Config) {
	onTmpfs := p.onTmpfs
	if onTmpfs == nil {
		onTmpfs = ipamdir.Dir.OnTmpfs
	}
	inMemory, fsType, err := onTmpfs(conf.Dir())
	switch {
	case err != nil:
		p.Reclaim.Logf("warning: cannot tell whether dataDir %s is on tmpfs: %v", conf.DataDir, err)
	case !inMemory:
		due, merr := (&reclaim.Attacher{Env: p.Reclaim}).ClaimNotTmpfsWarning(conf.Dir())
		if merr != nil {
			p.Reclaim.Logf("warning: %v", merr)
		}
		if due {
			p.Reclaim.Logf("warning: dataDir %s is not on tmpfs (filesystem magic 0x%x): its leases survive a reboot; mount a tmpfs there or point \"dataDir\" at one (e.g. /run/cni) (said once per boot for network %s)", conf.DataDir, fsType, conf.Name)
		}
	}
}

// delegateAdd delegates the ADD. After BeginAdd released a stale earlier
// attachment of the same container ID and ifname (a restore in place:
// Nomad re-created the namespace and ADDs again), its addresses are asked
// for again where no lease holds them, so the restored container keeps
// its address (those the ranges still hold); if bridge fails with them
// (taken since the check), what it made is undone and the ADD is made
// asking for nothing. One context bounds all of it, as one delegate call.
func (p *Plugin) delegateAdd(ctx context.Context, args *skel.CmdArgs, conf *netconf.Config, delegateConf []byte, attach *reclaim.PendingAdd) (types.Result, error) {
	exec := p.Exec.Inheriting(attach.LockFile)
	// Only those the ranges hold now: host-local would refuse them all.
	free := conflists.InRanges(delegateConf, freeAddresses(conf.Dir(), attach.Previous))
	requesting, ok, err := conf.DelegateConfigRequesting(free)
	if err != nil || !ok || asksForIP(args.Args) {
		return invoke.DelegateAdd(ctx, conf.Delegate, delegateConf, exec)
	}
	result, err := invoke.DelegateAdd(ctx, conf.Delegate, requesting, exec)
	if err == nil || ctx.Err() != nil {
		return result, err
	}
	p.Reclaim.Logf("%s: %s: the earlier address %s could not be had again (%v): taking any free one", conf.Name, attach.Record.Key(), strings.Join(free, ", "), err)
	if derr := invoke.DelegateDel(ctx, conf.Delegate, delegateConf, exec); derr != nil {
		p.Reclaim.Logf("warning: undoing the ADD that asked for %s: %v", strings.Join(free, ", "), derr)
		return nil, err
	}
	return invoke.DelegateAdd(ctx, conf.Delegate, delegateConf, exec)
}

// freeAddresses are the addresses of cidrs (as records keep them) that no
// lease file in d holds. What cannot be told is not free.
func freeAddresses(d ipamdir.Dir, cidrs []string) []string {
	var free []string
	for _, c := range cidrs {
		prefix, err := netip.ParsePrefix(c)
		if err != nil {
			continue
		}
		addr := prefix.Addr().Unmap()
		if !statefile.Exists(d.Lease(addr.AsSlice())) {
			free = append(free, addr.String())
		}
	}
	return free
}

// asksForIP reports whether CNI_ARGS asks host-local for an address (IP=):
// the runtime's request wins.
func asksForIP(cniArgs string) bool {
	for pair := range strings.SplitSeq(cniArgs, ";") {
		if key, _, _ := strings.Cut(pair, "="); key == "IP" {
			return true
		}
	}
	return false
}

// beginAddError gives a refused or failed BeginAdd the CNI code a runtime
// acts on: 11 (try again) for an ADD still running, 8 for a namespace that
// is none, 5 for a record that cannot be written, 999 for an attachment
// that must be DELeted first, and for anything else.
func beginAddError(err error) error {
	var refused *reclaim.AddError
	if !errors.As(err, &refused) {
		return types.NewError(types.ErrInternal, "failed to prepare the ADD", err.Error())
	}
	code := uint(types.ErrInternal)
	switch {
	case errors.Is(err, reclaim.ErrAddInProgress):
		code = types.ErrTryAgainLater
	case errors.Is(err, reclaim.ErrNoNamespace):
		code = types.ErrInvalidNetNS
	case errors.Is(err, reclaim.ErrRecordWrite):
		code = types.ErrIOFailure
	}
	// Installed as bridge, the runtime's event says "plugin type=bridge
	// failed": the message says first who refused.
	return types.NewError(code, "nomad-bridge-cni refused the ADD: "+refused.Msg, refused.Detail)
}

// maxKeyLength bounds containerID + ifname: the record's file name
// (ipamdir.RecordName) must fit a file name (255 bytes) with room for the
// temp-file prefix. Runtimes use IDs of 64 characters or fewer.
const maxKeyLength = 200

// checkTarget refuses, before anything is written, what skel lets through
// but no attachment can be made of: an ID too long to record, and a
// CNI_NETNS that is not an absolute path.
func checkTarget(args *skel.CmdArgs) error {
	if len(args.ContainerID)+1+len(args.IfName) > maxKeyLength {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_CONTAINERID and CNI_IFNAME are longer than %d bytes together", maxKeyLength), "")
	}
	if !filepath.IsAbs(args.Netns) {
		// Recorded as given, it would be judged later against whatever
		// directory a sweep runs in.
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_NETNS %q is not an absolute path", args.Netns), "")
	}
	return nil
}

// refuseOwnNamespace refuses CNI_NETNS naming the plugin's own network
// namespace (the host's), for every verb and before anything is
// delegated: bridge would configure the host's namespace on ADD and delete
// the host's link of that name on DEL, and upstream skel only checks after
// the verb ran.
func (p *Plugin) refuseOwnNamespace(netns string) error {
	own, err := (&reclaim.Attacher{Env: p.Reclaim}).IsOwnNamespace(netns)
	if err != nil {
		return types.NewError(types.ErrInvalidNetNS, "cannot tell whether CNI_NETNS is the plugin's own network namespace", err.Error())
	}
	if own {
		return types.NewError(types.ErrInvalidNetNS, fmt.Sprintf("CNI_NETNS %s is the plugin's own network namespace (the host's): refused before anything is delegated, so that no host interface is touched", netns), "")
	}
	return nil
}

// addSlack is what an ADD may take besides its delegate's calls (records,
// migration, NAT clean-up) before a sweep may end what still runs of it.
const addSlack = 30 * time.Second

func resultIPs(result types.Result) []string {
	r, err := current.NewResultFromResult(result)
	if err != nil {
		return nil
	}
	ips := make([]string, 0, len(r.IPs))
	for _, ip := range r.IPs {
		ips = append(ips, ip.Address.String())
	}
	return ips
}

func (p *Plugin) printResult(result types.Result, cniVersion string) error {
	converted, err := result.GetAsVersion(cniVersion)
	if err != nil {
		return types.NewError(types.ErrIncompatibleCNIVersion, "failed to convert the delegate's result to cniVersion "+cniVersion, err.Error())
	}
	if err := converted.PrintTo(p.Stdout); err != nil {
		return types.NewError(types.ErrIOFailure, "failed to print the result", err.Error())
	}
	return nil
}
