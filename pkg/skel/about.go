package skel

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/conflists"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/plugin"
)

// aboutTimeout bounds the delegate's own about line (Nomad gives a
// fingerprinted plugin 3 s).
const aboutTimeout = 2 * time.Second

// printAbout answers a run with no arguments, which is how Nomad
// fingerprints every executable in cni_path: it records the first token
// that parses as a version, the last cni_path directory's winning, and
// nothing for an output without one. Under its own name the plugin prints
// its about line on stdout and the spec versions on stderr. Installed
// under its delegate's name (as `bridge`) with CNI_PATH set, it prints the
// delegate it would call first, as the delegate printed it, then its own
// line: a runtime reads the delegate's version, as it would without the
// plugin (Nomad sends CHECK only when bridge is 1.3.0 or later). Without
// CNI_PATH (Nomad's fingerprint sets none) it cannot know which bridge the
// runtime's path makes it call: it says so, in words no token of which
// is a version, so that Nomad keeps the version of the reference bridge
// in cni_path.
func printAbout(invokedAs string, getenv func(string) string, stdout, stderr io.Writer) int {
	if invokedAs != conflists.PluginName {
		p := getenv("CNI_PATH")
		if p == "" {
			fmt.Fprintf(stdout, "CNI %s plugin (%s@%s) installed as %s: it calls the next %s in the runtime's CNI_PATH, and none is set here\n", conflists.PluginName, conflists.PluginName, Version, invokedAs, invokedAs)
			fmt.Fprintf(stderr, "CNI protocol versions supported: %s.\n", strings.Join(SupportedVersions.SupportedVersions(), ", "))
			return 0
		}
		// A copy behind a script of the delegate's name would be found
		// again and again (see plugin.EnvDelegating).
		depth := plugin.DelegationDepth()
		if path, err := plugin.FindDelegate(invokedAs, filepath.SplitList(p)); err == nil && depth < plugin.MaxDelegationDepth {
			return printDelegateAbout(path, depth+1, stdout, stderr)
		}
	}
	fmt.Fprintln(stdout, About())
	fmt.Fprintf(stderr, "CNI protocol versions supported: %s\n", strings.Join(SupportedVersions.SupportedVersions(), ", "))
	return 0
}

// printDelegateAbout passes on what the delegate prints when run with no
// arguments, then adds the plugin's own line.
func printDelegateAbout(path string, depth int, stdout, stderr io.Writer) int {
	ctx, cancel := context.WithTimeout(context.Background(), aboutTimeout)
	defer cancel()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = append(os.Environ(), plugin.EnvDelegating+"="+strconv.Itoa(depth))
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.WaitDelay = time.Second // a child left holding its output
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
