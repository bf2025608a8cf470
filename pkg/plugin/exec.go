package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/crashpoint"
)

// waitDelay is how long a delegate's output pipes may stay open after its
// context ended: a child it left behind (a hung `sleep`, say) must not keep
// us waiting past delegateTimeout.
const waitDelay = 2 * time.Second

// delegateExec runs delegates like invoke.RawExec, with two differences
// that make delegateTimeout hold and failures legible:
//   - each delegate runs in its own process group, and the whole group is
//     killed when the context ends (bridge's host-local child included),
//     with WaitDelay so an orphan holding stdout open cannot block us;
//   - a delegate that exits non-zero without a CNI error on stdout (a crash,
//     a kill) yields a plain error, never a *types.Error: invoke's RawExec
//     would make it a types.Error with code 0, indistinguishable from an
//     answer.
type delegateExec struct {
	version.PluginDecoder
	stderr io.Writer
	// inherit, when set, is passed to the delegate as fd 3 (see Inheriting).
	inherit *os.File
	// found remembers where each plugin name and CNI_PATH was found: the
	// plugin checks up-front that its delegate can be found, and
	// invoke.Delegate* looks it up again.
	found map[string]string
	// depth is this process's delegation depth; its delegates get one
	// more (see EnvDelegating).
	depth int
	// netnsOverride is the runtime's CNI_NETNS_OVERRIDE, if it set one
	// (netnsOverrideSet): the delegates get that (see EnvNetnsOverride).
	netnsOverride    string
	netnsOverrideSet bool
}

// EnvNetnsOverride, set to "1" or "true", switches off upstream skel's
// check that CNI_NETNS is not the plugin's own namespace. skel reads it
// from the process environment only, so pkg/skel sets it there: skel runs
// its check after ADD and DEL, too late (bridge has already deleted the
// host's link on DEL), and by opening CNI_NETNS, which blocks for ever on
// a FIFO planted there. The verbs refuse the plugin's own namespace
// first, without opening it (see refuseOwnNamespace). The delegates,
// whose environment delegateExec builds, get the runtime's value.
const EnvNetnsOverride = "CNI_NETNS_OVERRIDE"

// FindInPath skips this plugin's own executable (see FindDelegate).
func (e *delegateExec) FindInPath(plugin string, paths []string) (string, error) {
	if e.found == nil {
		e.found = map[string]string{}
	}
	key := plugin + "\x00" + strings.Join(paths, "\x00")
	if path, ok := e.found[key]; ok {
		return path, nil
	}
	path, err := FindDelegate(plugin, paths)
	if err == nil {
		e.found[key] = path
	}
	return path, err
}

// Inheriting returns a copy of e whose delegates inherit f. The delegate
// gets it as fd 3, not close-on-exec, and so does everything it starts
// (exec closes only close-on-exec descriptors, and Go's os/exec, bridge's,
// opens all of its own so), until the last of them exits.
func (e *delegateExec) Inheriting(f *os.File) invoke.Exec {
	c := *e
	c.inherit = f
	return &c
}

func (e *delegateExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	crashpoint.Step("exec " + pluginPath)
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, pluginPath)
	cmd.Env = e.env(environ)
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = waitDelay
	if e.inherit != nil {
		cmd.ExtraFiles = []*os.File{e.inherit}
	}

	err := cmd.Run()
	if e.stderr != nil && stderr.Len() > 0 {
		_, _ = stderr.WriteTo(e.stderr)
	}
	if err == nil {
		return stdout.Bytes(), nil
	}
	var cniErr types.Error
	if json.Unmarshal(stdout.Bytes(), &cniErr) == nil && cniErr.Code != 0 {
		return nil, &cniErr
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return nil, fmt.Errorf("%s: %w (%v)", pluginPath, ctxErr, err)
	}
	detail := stdout.String()
	if detail == "" {
		detail = "no output"
	} else if len(detail) > 512 {
		detail = detail[:512] + "..."
	}
	return nil, fmt.Errorf("%s: %v; stdout: %q", pluginPath, err, detail)
}

// env is a delegate's environment: environ, with the runtime's
// CNI_NETNS_OVERRIDE (or none) and the delegation depth.
func (e *delegateExec) env(environ []string) []string {
	env := without(environ, EnvNetnsOverride)
	if e.netnsOverrideSet {
		env = append(env, EnvNetnsOverride+"="+e.netnsOverride)
	}
	return append(env, EnvDelegating+"="+strconv.Itoa(e.depth+1))
}

// envExec is an invoke.Exec whose delegates get key=value in their
// environment, whatever the process's own: how a verb changes what its
// delegate sees (a DEL's CNI_NETNS) without os.Setenv.
type envExec struct {
	invoke.Exec
	key, value string
}

func (e *envExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	return e.Exec.ExecPlugin(ctx, pluginPath, stdin, append(without(environ, e.key), e.key+"="+e.value))
}

// without is environ without key's entries, in a new slice.
func without(environ []string, key string) []string {
	return slices.DeleteFunc(slices.Clone(environ), func(kv string) bool { return strings.HasPrefix(kv, key+"=") })
}
