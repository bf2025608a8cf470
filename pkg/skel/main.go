// Package skel is the entry point of the nomad-bridge-cni binary. It picks
// a mode from how it was started: CNI mode when the runtime set
// CNI_COMMAND, the operator CLI on an explicit subcommand or flag, and the
// about line when run with nothing at all (Nomad's fingerprint).
package skel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	cniskel "github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/cli"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netconf"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/plugin"
)

// Main runs the binary and returns its exit code.
func Main(args []string) int {
	return run(filepath.Base(os.Args[0]), args, os.Getenv, os.Stdout, os.Stderr)
}

// run dispatches; invokedAs is the name the binary was started by, which
// is its delegate's when it is installed as `bridge`.
func run(invokedAs string, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	switch {
	case getenv("CNI_COMMAND") != "":
		return runCNI(getenv("CNI_COMMAND"))
	case len(args) == 0:
		return printAbout(invokedAs, getenv, stdout, stderr)
	default:
		return cli.Run(args, stdout, stderr, About())
	}
}

// runCNI hands the process to the CNI skeleton, which reads the CNI_*
// environment and stdin, and prints either our result or a types.Error
// on stdout.
func runCNI(command string) int {
	if command != "VERSION" { // VERSION reads no stdin
		stdin, err := capStdin(os.Stdin, netconf.MaxConfigSize)
		if err != nil {
			return printError(err)
		}
		os.Stdin = stdin
	}
	if err := cniskel.PluginMainFuncsWithError(withoutSkelNetnsCheck(plugin.New().Funcs()), SupportedVersions, About()); err != nil {
		return printError(err)
	}
	return 0
}

// netnsOverrideEnv switches off upstream skel's check that CNI_NETNS is not
// the plugin's own namespace.
const netnsOverrideEnv = "CNI_NETNS_OVERRIDE"

// withoutSkelNetnsCheck switches off skel's own-namespace check for this
// process: skel runs it after ADD and DEL, too late (bridge has already
// deleted the host's link on DEL), and by opening CNI_NETNS, which blocks
// for ever on a FIFO planted there. The verbs refuse the plugin's own
// namespace first, without opening it. The runtime's own
// CNI_NETNS_OVERRIDE is put back before a verb runs, for its delegates.
func withoutSkelNetnsCheck(funcs cniskel.CNIFuncs) cniskel.CNIFuncs {
	value, set := os.LookupEnv(netnsOverrideEnv)
	_ = os.Setenv(netnsOverrideEnv, "1")
	restore := func() {
		if set {
			_ = os.Setenv(netnsOverrideEnv, value)
		} else {
			_ = os.Unsetenv(netnsOverrideEnv)
		}
	}
	wrap := func(verb func(*cniskel.CmdArgs) error) func(*cniskel.CmdArgs) error {
		if verb == nil {
			return nil
		}
		return func(args *cniskel.CmdArgs) error {
			restore()
			return verb(args)
		}
	}
	funcs.Add, funcs.Del, funcs.Check, funcs.GC, funcs.Status = wrap(funcs.Add), wrap(funcs.Del), wrap(funcs.Check), wrap(funcs.GC), wrap(funcs.Status)
	return funcs
}

func printError(err *types.Error) int {
	if perr := err.Print(); perr != nil {
		fmt.Fprintf(os.Stderr, "nomad-bridge-cni: failed to print error %q: %v\n", err.Error(), perr)
	}
	return 1
}

// precheck refuses what skel would misreport: a JSON null (skel reads it
// as an empty config, "missing network name"), and an empty "cniVersion"
// (skel reads it as 0.1.0 and reports that version as the problem).
func precheck(data []byte) *types.Error {
	if bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
		return types.NewError(types.ErrDecodingFailure, "failed to decode network configuration", "configuration is not a JSON object")
	}
	var conf struct {
		CNIVersion *string `json:"cniVersion"`
	}
	if json.Unmarshal(data, &conf) == nil && conf.CNIVersion != nil && *conf.CNIVersion == "" {
		return types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("\"cniVersion\" is empty: set it to one of %q", SupportedVersions.SupportedVersions()), "")
	}
	return nil
}

// capStdin reads at most limit bytes of in and returns a file the skeleton
// can read them from (skel reads os.Stdin itself, to its end).
func capStdin(in io.Reader, limit int64) (*os.File, *types.Error) {
	data, err := io.ReadAll(io.LimitReader(in, limit+1))
	if err != nil {
		return nil, types.NewError(types.ErrIOFailure, "failed to read the network configuration from stdin", err.Error())
	}
	if int64(len(data)) > limit {
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("network configuration on stdin is larger than %d bytes", limit), "")
	}
	if err := precheck(data); err != nil {
		return nil, err
	}
	f, err := fileWith(data)
	if err != nil {
		// Without memfd_create (a seccomp profile may refuse it), a pipe.
		f, err = pipeWith(data)
	}
	if err != nil {
		return nil, types.NewError(types.ErrIOFailure, "failed to pass the network configuration on", err.Error())
	}
	return f, nil
}

// fileWith is an anonymous in-memory file holding data, read from its
// start: the skeleton reads it like any stdin, with no pipe, no goroutine
// feeding it and nothing for the runtime's poller to watch.
func fileWith(data []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate("nomad-bridge-cni-stdin", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "stdin")
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// pipeWith is a pipe a goroutine writes data to: the skeleton reads
// until EOF, and a write error means it stopped reading, which it reports
// itself.
func pipeWith(data []byte) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	go func() {
		_, _ = w.Write(data)
		w.Close()
	}()
	return r, nil
}
