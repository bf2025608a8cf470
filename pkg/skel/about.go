package skel

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/plugin"
)

// defaultPluginDirs are where runtimes keep CNI plugins by default (Nomad,
// containerd and CRI-O /opt/cni/bin; podman's list on Debian and Fedora).
// Nomad fingerprints plugins without setting CNI_PATH: these are searched
// for the delegate then.
var defaultPluginDirs = []string{"/opt/cni/bin", "/usr/local/libexec/cni", "/usr/libexec/cni", "/usr/local/lib/cni", "/usr/lib/cni"}

// aboutTimeout bounds the delegate's own about line (Nomad gives a
// fingerprinted plugin 3 s).
const aboutTimeout = 2 * time.Second

// printAbout answers a run with no arguments, which is how Nomad
// fingerprints every executable in cni_path: it records the first semver
// printed. Under its own name the plugin prints its about line on stdout
// and the spec versions on stderr. Installed under its delegate's name (as
// `bridge`), it prints the delegate's own answer first, as the delegate
// printed it, then its own line: a runtime then reads the delegate's
// version, as it would without the plugin (Nomad sends CHECK only when
// bridge is 1.3.0 or later).
func printAbout(invokedAs string, getenv func(string) string, stdout, stderr io.Writer) int {
	if invokedAs != PluginName && invokedAs != "" {
		dirs := defaultPluginDirs
		if p := getenv("CNI_PATH"); p != "" {
			dirs = filepath.SplitList(p)
		}
		if path, err := plugin.FindDelegate(invokedAs, dirs); err == nil {
			return printDelegateAbout(path, stdout, stderr)
		}
	}
	fmt.Fprintln(stdout, About())
	fmt.Fprintf(stderr, "CNI protocol versions supported: %s\n", strings.Join(SupportedVersions.SupportedVersions(), ", "))
	return 0
}

// printDelegateAbout passes on what the delegate prints when run with no
// arguments, then adds the plugin's own line.
func printDelegateAbout(path string, stdout, stderr io.Writer) int {
	ctx, cancel := context.WithTimeout(context.Background(), aboutTimeout)
	defer cancel()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, path)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	_, _ = out.WriteTo(stdout)
	_, _ = errOut.WriteTo(stderr)
	fmt.Fprintf(stdout, "%s, in front of %s\n", About(), path)
	if err != nil {
		fmt.Fprintf(stderr, "nomad-bridge-cni: %s: %v\n", path, err)
		return 1
	}
	return 0
}
