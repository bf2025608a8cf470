package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	gocni "github.com/containerd/go-cni"
	"github.com/containernetworking/cni/libcni"
)

// The runtimes' CNI libraries as the runtime tests drive them: go-cni
// (containerd, nerdctl, Nomad) and libcni (CRI-O's ocicni, Apptainer), the
// results they hand back, libcni's cache, and how a control run on bare
// bridge must fail.

// runtimeCtx bounds a test's library calls like every other command.
func runtimeCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	t.Cleanup(cancel)
	return ctx
}

// goCNI is containerd's (and nerdctl's) CNI library loaded with one conflist.
func (e *testEnv) goCNI(t *testing.T, opts ...gocni.Opt) gocni.CNI {
	t.Helper()
	c, err := gocni.New(append([]gocni.Opt{gocni.WithPluginDir([]string{e.bin})}, opts...)...)
	if err != nil {
		t.Fatalf("go-cni: %v", err)
	}
	return c
}

// goCNIResult is the one network's result of a go-cni Setup in the shape
// the other tests use.
func goCNIResult(t *testing.T, res *gocni.Result) cniResult {
	t.Helper()
	if res == nil || len(res.Raw()) != 1 {
		t.Fatalf("go-cni result: want one network's result, got %+v", res)
	}
	if cfg, ok := res.Interfaces["eth0"]; !ok || len(cfg.IPConfigs) == 0 {
		t.Fatalf("go-cni result has no IPs on eth0: %+v", res.Interfaces)
	}
	return parseResult(t, string(mustJSON(t, res.Raw()[0])))
}

// libcniNet is one conflist as libcni-based runtimes load and drive it.
type libcniNet struct {
	cfg  *libcni.CNIConfig
	list *libcni.NetworkConfigList
	ctx  context.Context
}

func (e *testEnv) libcniNet(t *testing.T, conf map[string]any) libcniNet {
	t.Helper()
	return libcniNet{cfg: e.libcniConfig(), list: e.loadConfList(t, conf), ctx: runtimeCtx(t)}
}

// add ADDs the attachment and returns the result in the shape the other
// tests use.
func (n libcniNet) add(t *testing.T, rt *libcni.RuntimeConf) (cniResult, error) {
	t.Helper()
	r, err := n.cfg.AddNetworkList(n.ctx, n.list, rt)
	if err != nil {
		return cniResult{}, err
	}
	return parseResult(t, string(mustJSON(t, r))), nil
}

func (n libcniNet) mustAdd(t *testing.T, rt *libcni.RuntimeConf) cniResult {
	t.Helper()
	res, err := n.add(t, rt)
	if err != nil {
		t.Fatalf("ADD of %s: %v", rt.ContainerID, err)
	}
	return res
}

// mustCheckDel CHECKs the attachment, then DELs it.
func (n libcniNet) mustCheckDel(t *testing.T, rt *libcni.RuntimeConf) {
	t.Helper()
	if err := n.cfg.CheckNetworkList(n.ctx, n.list, rt); err != nil {
		t.Fatalf("CHECK of %s: %v", rt.ContainerID, err)
	}
	if err := n.cfg.DelNetworkList(n.ctx, n.list, rt); err != nil {
		t.Fatalf("DEL of %s: %v", rt.ContainerID, err)
	}
}

// cachedResult is libcni's cache file of one attachment in the default
// cache directory (containerd, nerdctl, CRI-O and Apptainer all use it).
func (e *testEnv) cachedResult(cacheDir, cid string) string {
	return filepath.Join(cacheDir, "results", e.netName+"-"+cid+"-"+ifName)
}

// assertControlFails checks that a control on bare bridge failed the way
// upstream does, with want in its error; otherwise the test no longer
// reproduces what the plugin fixes. out is what the control returned
// (stdout, or a library's result), shown when it succeeded.
func assertControlFails(t *testing.T, out any, err error, want string) {
	t.Helper()
	if err == nil {
		if _, ok := out.(string); !ok {
			out = mustJSON(t, out)
		}
		t.Fatalf("control: succeeded on bare bridge; the test no longer reproduces the bug\noutput: %s", out)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("control: failed, but not with %q: %v", want, err)
	}
	t.Logf("control failed the upstream way: %s", lineWith(err.Error(), want))
}

// lineWith is the first line of s that contains sub (the plugin's error
// message inside a long error), or s.
func lineWith(s, sub string) string {
	for line := range strings.SplitSeq(s, "\n") {
		if strings.Contains(line, sub) {
			return strings.TrimSpace(line)
		}
	}
	return s
}
