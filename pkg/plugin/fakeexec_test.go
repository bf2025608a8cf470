package plugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/version"
)

// fakeExec stands in for the delegate processes: it records the exact
// stdin and environment each one would get and answers with canned output.
type fakeExec struct {
	version.PluginDecoder
	// installed lists the plugins FindInPath can find.
	installed map[string]bool
	// reply maps "plugin VERB" to the delegate's stdout; missing means "".
	reply map[string]string
	// fail maps "plugin VERB" to an error the delegate returns.
	fail  map[string]error
	calls []execCall
	// onExec runs inside every delegate call, to observe state mid-verb.
	onExec func()
	// hang maps "plugin VERB" to delegates that never answer: they return
	// only when the context ends, as a killed process would.
	hang map[string]bool
	// failIf, when set, fails the calls it returns an error for.
	failIf func(call execCall) error
}

type execCall struct {
	Plugin  string
	Command string
	Stdin   string
	Env     map[string]string
	// Inherited is the file the delegate would inherit (see Inheriting).
	Inherited *os.File
	// Bound is how long the call's context gave it (0: no deadline).
	Bound time.Duration
}

func newFakeExec(installed ...string) *fakeExec {
	f := &fakeExec{installed: map[string]bool{}, reply: map[string]string{}, fail: map[string]error{}, hang: map[string]bool{}}
	for _, p := range installed {
		f.installed[p] = true
	}
	return f
}

func (f *fakeExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	return f.exec(ctx, pluginPath, stdin, environ, nil)
}

// Inheriting is delegateExec.Inheriting: the calls made through the
// returned Exec record the file.
func (f *fakeExec) Inheriting(file *os.File) invoke.Exec { return &fakeInheriting{f, file} }

type fakeInheriting struct {
	*fakeExec
	file *os.File
}

func (f *fakeInheriting) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	return f.exec(ctx, pluginPath, stdin, environ, f.file)
}

func (f *fakeExec) exec(ctx context.Context, pluginPath string, stdin []byte, environ []string, inherited *os.File) ([]byte, error) {
	env := map[string]string{}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	call := execCall{Plugin: filepath.Base(pluginPath), Command: env["CNI_COMMAND"], Stdin: string(stdin), Env: env, Inherited: inherited}
	if deadline, ok := ctx.Deadline(); ok {
		call.Bound = time.Until(deadline)
	}
	f.calls = append(f.calls, call)
	if f.onExec != nil {
		f.onExec()
	}
	key := call.Plugin + " " + call.Command
	if f.hang[key] {
		<-ctx.Done()
		return nil, fmt.Errorf("signal: killed")
	}
	if err := f.fail[key]; err != nil {
		return nil, err
	}
	if f.failIf != nil {
		if err := f.failIf(call); err != nil {
			return nil, err
		}
	}
	return []byte(f.reply[key]), nil
}

func (f *fakeExec) FindInPath(plugin string, paths []string) (string, error) {
	if len(paths) == 0 {
		return "", fmt.Errorf("no paths provided")
	}
	if !f.installed[plugin] {
		return "", fmt.Errorf("failed to find plugin %q in path %s", plugin, paths)
	}
	return filepath.Join(paths[0], plugin), nil
}

func (f *fakeExec) only(t *testing.T) execCall {
	t.Helper()
	if len(f.calls) != 1 {
		t.Fatalf("delegate calls = %d (%+v), want exactly 1", len(f.calls), f.calls)
	}
	return f.calls[0]
}
