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

// Main runs the binary and returns its exit code. In CNI mode it hands
// the process to the CNI skeleton, which reads the CNI_* environment and
// stdin, calls the verb (plugin.Plugin's Funcs) and prints either our
// result or a types.Error on stdout.
func Main(args []string) int {
	command := os.Getenv("CNI_COMMAND")
	if command == "" {
		return runTool(filepath.Base(os.Args[0]), args, os.Getenv, os.Stdout, os.Stderr)
	}
	if command != "VERSION" { // VERSION reads no stdin
		stdin, err := capStdin(os.Stdin, netconf.MaxConfigSize)
		if err != nil {
			return printError(err)
		}
		os.Stdin = stdin
	}
	// plugin.New reads the runtime's CNI_NETNS_OVERRIDE, for its delegates,
	// before skel's own check is switched off (see plugin.EnvNetnsOverride).
	p := plugin.New()
	_ = os.Setenv(plugin.EnvNetnsOverride, "1")
	if err := cniskel.PluginMainFuncsWithError(p.Funcs(), SupportedVersions, About()); err != nil {
		return printError(err)
	}
	return 0
}

// runTool runs the binary outside CNI mode; invokedAs is the name it was
// started by, which is its delegate's when it is installed as `bridge`.
func runTool(invokedAs string, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return printAbout(invokedAs, getenv, stdout, stderr)
	}
	return cli.Run(args, stdout, stderr, About())
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
		return netconf.CheckVersion("")
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
	// WriteAt leaves the offset at the start, where skel reads from.
	if _, err := f.WriteAt(data, 0); err != nil {
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
