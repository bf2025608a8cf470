package plugin

import (
	"os"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
)

// Del delegates DEL, then finishes what bridge leaves undone. It is
// idempotent: a second DEL, a missing namespace, an empty CNI_NETNS or a
// missing lease all succeed.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	conf, delegateConf, err := p.load(args)
	if err != nil {
		return err
	}
	if args.Netns != "" && !(&reclaim.Attacher{Env: p.Reclaim}).NamespaceUsable(args.Netns) {
		// bridge handles a missing path, but fails on a path that is no
		// longer a namespace (an unmounted netns file); with no netns it
		// just releases the lease, which is all that is left to do there.
		if err := os.Setenv("CNI_NETNS", ""); err != nil {
			return types.NewError(types.ErrInternal, "failed to clear CNI_NETNS for the delegate", err.Error())
		}
	}
	ctx, cancel := delegateCtx(conf)
	defer cancel()
	if err := invoke.DelegateDel(ctx, conf.Delegate, delegateConf, p.Exec); err != nil {
		return delegateError(ctx, conf.Delegate, "del", err)
	}
	if err := (&reclaim.Attacher{Env: p.Reclaim}).EndDel(conf.Dir(), attachmentKey(args), args.Netns); err != nil {
		return types.NewError(types.ErrInternal, "failed to release what the delegate left behind", err.Error())
	}
	return nil
}
