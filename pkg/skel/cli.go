package skel

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/pflag"
)

const usage = `nomad-bridge-cni: a CNI plugin that wraps "bridge" and keeps host-local's
leases on tmpfs, so containers restored after a reboot get their address back.

As a CNI plugin it is run by the container runtime (CNI_COMMAND set). Put it in
your CNI bin directory (/opt/cni/bin) and change one word in a conflist:
  "type": "bridge"  ->  "type": "nomad-bridge-cni"

Usage:
  nomad-bridge-cni                 print the version line and exit
  nomad-bridge-cni --version       print the version line and exit
  nomad-bridge-cni -h | --help     show this help

Flags:
`

// runCLI is the operator's entry point: flags and subcommands, never the
// CNI protocol.
func runCLI(args []string, stdout, stderr io.Writer) int {
	flags := pflag.NewFlagSet(PluginName, pflag.ContinueOnError)
	flags.SetOutput(stderr)
	showVersion := flags.Bool("version", false, "print the version line and exit")
	flags.Usage = func() {
		fmt.Fprint(stderr, usage)
		fmt.Fprint(stderr, flags.FlagUsages())
	}

	if err := flags.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			flags.SetOutput(stdout)
			fmt.Fprint(stdout, usage)
			fmt.Fprint(stdout, flags.FlagUsages())
			return 0
		}
		fmt.Fprintf(stderr, "nomad-bridge-cni: %v\nRun 'nomad-bridge-cni --help' for usage.\n", err)
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, About())
		return 0
	}
	if flags.NArg() > 0 {
		fmt.Fprintf(stderr, "nomad-bridge-cni: unknown command %q\nRun 'nomad-bridge-cni --help' for usage.\n", flags.Arg(0))
		return 2
	}
	flags.Usage()
	return 2
}
