package plugin

import (
	"context"

	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netconf"
)

// passThrough delegates one verb with the entry unchanged, and prints what
// the delegate answered, nothing more.
func (p *Plugin) passThrough(verb string, conf *netconf.Config, stdin []byte) error {
	if err := p.find(conf.Delegate); err != nil {
		return err
	}
	if verb != "add" {
		return p.delegate(conf, verb, conf.Delegate, stdin, p.Exec)
	}
	ctx, cancel := delegateCtx(conf)
	defer cancel()
	result, err := invoke.DelegateAdd(ctx, conf.Delegate, stdin, p.Exec)
	if err != nil {
		return delegateError(ctx, conf.Delegate, verb, err)
	}
	return p.printResult(result, conf.CNIVersion)
}

// delegateCalls are invoke's calls of the verbs whose delegate prints no
// result.
var delegateCalls = map[string]func(context.Context, string, []byte, invoke.Exec) error{
	"check":  invoke.DelegateCheck,
	"del":    invoke.DelegateDel,
	"gc":     invoke.DelegateGC,
	"status": invoke.DelegateStatus,
}

// delegate runs verb (any but ADD) of plugin on stdin within a
// delegateTimeout of its own (a rollback never inherits the expired bound
// of the ADD it undoes), and reports its failure as delegateError does.
func (p *Plugin) delegate(conf *netconf.Config, verb, plugin string, stdin []byte, exec invoke.Exec) error {
	ctx, cancel := delegateCtx(conf)
	defer cancel()
	if err := delegateCalls[verb](ctx, plugin, stdin, exec); err != nil {
		return delegateError(ctx, plugin, verb, err)
	}
	return nil
}
