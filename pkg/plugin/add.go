package plugin

import (
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

// Add delegates ADD with host-local's dataDir rewritten and prints the
// delegate's result in the entry's cniVersion, so later plugins in the
// chain see exactly what bridge would have given them.
func (p *Plugin) Add(args *skel.CmdArgs) error {
	conf, delegateConf, err := p.load(args)
	if err != nil {
		return err
	}
	if err := conf.EnsureDataDir(); err != nil {
		return types.NewError(types.ErrIOFailure, "failed to prepare dataDir", err.Error())
	}
	p.warnIfPersistent(conf)

	result, err := invoke.DelegateAdd(ctx(), conf.Delegate, delegateConf, p.Exec)
	if err != nil {
		return delegateError(conf.Delegate, "add", err)
	}
	return p.printResult(result, conf.CNIVersion)
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
