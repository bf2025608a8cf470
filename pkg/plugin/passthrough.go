package plugin

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netconf"
)

// passThrough delegates one verb with the entry unchanged, and prints what
// the delegate answered, nothing more.
func (p *Plugin) passThrough(verb string, conf *netconf.Config, stdin []byte) error {
	if err := p.find(conf.Delegate); err != nil {
		return err
	}
	ctx, cancel := delegateCtx(conf)
	defer cancel()
	var err error
	switch verb {
	case "add":
		result, aerr := invoke.DelegateAdd(ctx, conf.Delegate, stdin, p.Exec)
		if aerr == nil {
			return p.printResult(result, conf.CNIVersion)
		}
		err = aerr
	case "check":
		err = invoke.DelegateCheck(ctx, conf.Delegate, stdin, p.Exec)
	case "del":
		err = invoke.DelegateDel(ctx, conf.Delegate, stdin, p.Exec)
	case "gc":
		err = invoke.DelegateGC(ctx, conf.Delegate, stdin, p.Exec)
	case "status":
		err = invoke.DelegateStatus(ctx, conf.Delegate, stdin, p.Exec)
	default:
		return fmt.Errorf("pass through: unknown verb %q", verb)
	}
	if err != nil {
		return delegateError(ctx, conf.Delegate, verb, err)
	}
	return nil
}
