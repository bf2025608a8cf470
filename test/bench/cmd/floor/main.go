// Command floor is the floor of the latency benchmark: a CNI plugin that
// does nothing but delegate. Every verb passes its stdin unchanged to the
// plugin the entry's "delegate" key names (default "bridge"; bridge ignores
// the entry's "type", so the same bytes are valid for it), and ADD prints
// the delegate's result. Chained in place of bridge it costs exactly one
// more exec of a small Go plugin built on the CNI library: what any
// delegating plugin, this repository's included, cannot avoid.
package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

type netConf struct {
	types.NetConf
	Delegate string `json:"delegate"`
}

func parse(stdin []byte) (*netConf, error) {
	conf := &netConf{Delegate: "bridge"}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, fmt.Errorf("parse network configuration: %w", err)
	}
	return conf, nil
}

func cmdAdd(args *skel.CmdArgs) error {
	conf, err := parse(args.StdinData)
	if err != nil {
		return err
	}
	result, err := invoke.DelegateAdd(context.Background(), conf.Delegate, args.StdinData, nil)
	if err != nil {
		return fmt.Errorf("delegate %s ADD: %w", conf.Delegate, err)
	}
	return types.PrintResult(result, conf.CNIVersion)
}

// noResult is a verb whose delegate prints nothing on success.
func noResult(verb string, delegate func(context.Context, string, []byte, invoke.Exec) error) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) error {
		conf, err := parse(args.StdinData)
		if err != nil {
			return err
		}
		if err := delegate(context.Background(), conf.Delegate, args.StdinData, nil); err != nil {
			return fmt.Errorf("delegate %s %s: %w", conf.Delegate, verb, err)
		}
		return nil
	}
}

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    cmdAdd,
		Check:  noResult("CHECK", invoke.DelegateCheck),
		Del:    noResult("DEL", invoke.DelegateDel),
		GC:     noResult("GC", invoke.DelegateGC),
		Status: noResult("STATUS", invoke.DelegateStatus),
	}, version.All, "nbc-floor: a do-nothing delegating CNI plugin (benchmark floor)")
}
