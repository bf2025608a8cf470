// Package skel is the entry point of the nomad-bridge-cni binary. It picks
// a mode from how it was started: CNI mode when the runtime set
// CNI_COMMAND, the operator CLI on an explicit subcommand or flag, and the
// about line when run with nothing at all (Nomad's fingerprint).
package skel

import (
	"fmt"
	"io"
	"os"
	"strings"

	cniskel "github.com/containernetworking/cni/pkg/skel"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/plugin"
)

// Main runs the binary and returns its exit code.
func Main(args []string) int {
	return run(args, os.Getenv, os.Stdout, os.Stderr)
}

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	switch {
	case getenv("CNI_COMMAND") != "":
		return runCNI()
	case len(args) == 0:
		printAbout(stdout, stderr)
		return 0
	default:
		return runCLI(args, stdout, stderr)
	}
}

// runCNI hands the process to the CNI skeleton, which reads the CNI_*
// environment and stdin, and prints either our result or a types.Error
// on stdout.
func runCNI() int {
	if err := cniskel.PluginMainFuncsWithError(plugin.New().Funcs(), SupportedVersions, About()); err != nil {
		if perr := err.Print(); perr != nil {
			fmt.Fprintf(os.Stderr, "nomad-bridge-cni: failed to print error %q: %v\n", err.Error(), perr)
		}
		return 1
	}
	return 0
}

// printAbout writes the about line on stdout, where a person and Nomad's
// fingerprinter both read it, and the spec versions on stderr as the
// reference plugins do.
func printAbout(stdout, stderr io.Writer) {
	fmt.Fprintln(stdout, About())
	fmt.Fprintf(stderr, "CNI protocol versions supported: %s\n", strings.Join(SupportedVersions.SupportedVersions(), ", "))
}
