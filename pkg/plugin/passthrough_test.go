package plugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/fakehost"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
)

// Installed as bridge, an entry with an IPAM the plugin does not manage
// reaches bridge byte for byte on every verb, and nothing else happens:
// reclaim gets only the host, which the refusal of the host's namespace
// reads, and no NAT cleaner; the data dir must not even be created.
func TestEntriesItDoesNotManagePassThrough(t *testing.T) {
	h := newHarness(t, "bridge")
	h.plugin.Reclaim = reclaim.Env{Host: h.host}
	h.exec.reply["bridge ADD"] = bridgeResult100
	stdin := []byte(`{"cniVersion":"1.0.0","name":"podman","type":"bridge","bridge":"cni-podman1","ipam":{"type":"static","addresses":[{"address":"172.26.64.2/20"}]},"dataDir":"` + h.dataDir + `"}`)
	funcs := h.plugin.Funcs()
	for _, verb := range []struct {
		name string
		run  func() error
	}{
		{"ADD", func() error { return funcs.Add(h.args(stdin)) }},
		{"CHECK", func() error { return funcs.Check(h.args(stdin)) }},
		{"DEL", func() error { return funcs.Del(h.args(stdin)) }},
		{"GC", func() error { return funcs.GC(h.args(stdin)) }},
		{"STATUS", func() error { return funcs.Status(h.args(stdin)) }},
	} {
		t.Setenv("CNI_COMMAND", verb.name)
		if err := verb.run(); err != nil {
			t.Fatalf("%s: %v", verb.name, err)
		}
		last := h.exec.calls[len(h.exec.calls)-1]
		if last.Plugin != "bridge" || last.Command != verb.name || last.Stdin != string(stdin) {
			t.Errorf("%s reached %s %s with %s; want bridge, unchanged", verb.name, last.Plugin, last.Command, last.Stdin)
		}
	}
	if len(h.exec.calls) != 5 {
		t.Errorf("%d delegate calls, want one per verb: %+v", len(h.exec.calls), h.exec.calls)
	}
	if h.stdout.String() == "" {
		t.Error("ADD printed no result")
	}
	if _, err := os.Stat(h.dataDir); !os.IsNotExist(err) {
		t.Errorf("a passed-through entry created %s (%v)", h.dataDir, err)
	}
}

// CNI_NETNS naming the plugin's own namespace (the host's) is refused by
// every verb before anything is delegated: bridge's DEL would delete the
// host's link of that name, and upstream skel checks only after the verb.
func TestOwnNamespaceRefusedByEveryVerb(t *testing.T) {
	for _, installed := range []string{"bridge", "nomad-bridge-cni"} {
		h := newHarness(t, "bridge")
		h.host.Namespaces["/run/netns/host-bind"] = fakehost.HostNetns
		stdin := h.conf("1.1.0", "")
		if installed == "bridge" {
			stdin = []byte(`{"cniVersion":"1.0.0","name":"podman","type":"bridge","bridge":"cni-podman1","ipam":{"type":"static","addresses":[{"address":"172.26.64.2/20"}]}}`)
		}
		funcs := h.plugin.Funcs()
		for _, verb := range []struct {
			name string
			run  func(*skel.CmdArgs) error
		}{{"ADD", funcs.Add}, {"CHECK", funcs.Check}, {"DEL", funcs.Del}} {
			for _, path := range []string{"/proc/self/ns/net", "/run/netns/host-bind"} {
				args := h.args(stdin)
				args.Netns = path
				t.Setenv("CNI_COMMAND", verb.name)
				err := verb.run(args)
				var cniErr *types.Error
				if !errors.As(err, &cniErr) || cniErr.Code != types.ErrInvalidNetNS {
					t.Errorf("%s %s with CNI_NETNS %s: %v, want code %d", installed, verb.name, path, err, types.ErrInvalidNetNS)
				}
			}
		}
		if len(h.exec.calls) != 0 {
			t.Errorf("%s: delegates ran: %+v", installed, h.exec.calls)
		}
		if _, err := os.Stat(h.dataDir); !os.IsNotExist(err) {
			t.Errorf("%s: a refused verb created %s (%v)", installed, h.dataDir, err)
		}
	}
}

// Installed as bridge and called by the plugin itself (its environment
// says so), a host-local entry the copy would manage otherwise is passed
// to the next bridge as it came: the caller manages the network, and a
// second wrap would keep a second set of records. The plugin sets the
// mark for its own delegates, and only while it runs.
func TestCalledByThePluginItActsAsTheDelegate(t *testing.T) {
	h := newHarness(t, "bridge")
	h.exec.reply["bridge ADD"] = bridgeResult100
	stdin := []byte(`{"cniVersion":"1.0.0","name":"nomad","type":"bridge","bridge":"nomad","ipam":{"type":"host-local","subnet":"172.26.64.0/20","dataDir":"` + h.dataDir + `"}}`)
	t.Setenv(EnvDelegating, "1")
	if err := h.plugin.Funcs().Add(h.args(stdin)); err != nil {
		t.Fatal(err)
	}
	if call := h.exec.only(t); call.Stdin != string(stdin) {
		t.Errorf("bridge got %s, want the entry as it came", call.Stdin)
	}
	if _, err := os.Stat(h.dataDir); !os.IsNotExist(err) {
		t.Errorf("the stand-in wrote state: %s (%v)", h.dataDir, err)
	}

	// Called through two copies, it refuses: copies call one another.
	t.Setenv(EnvDelegating, "2")
	h2 := newHarness(t, "bridge")
	err := h2.plugin.Funcs().Add(h2.args(stdin))
	var cniErr *types.Error
	if !errors.As(err, &cniErr) || cniErr.Code != types.ErrInvalidNetworkConfig || !strings.Contains(cniErr.Msg, "copies") {
		t.Errorf("ADD through two copies = %v, want code 7 naming the copies", err)
	}
	if len(h2.exec.calls) != 0 {
		t.Errorf("a delegate ran: %+v", h2.exec.calls)
	}
}

// The plugin's delegates are told how many copies of it called them, one
// more than called the plugin: the mark a copy of it reads.
func TestDelegatesAreMarked(t *testing.T) {
	script := filepath.Join(t.TempDir(), "bridge")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho \"$"+EnvDelegating+"\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for depth, want := range map[int]string{0: "1", 1: "2"} {
		out, err := (&delegateExec{depth: depth}).ExecPlugin(context.Background(), script, nil, []string{EnvDelegating + "=7"})
		if err != nil || strings.TrimSpace(string(out)) != want {
			t.Errorf("depth %d: the delegate saw %s=%q (%v), want %q", depth, EnvDelegating, out, err, want)
		}
	}
	if _, had := os.LookupEnv(EnvDelegating); had {
		t.Errorf("%s is set in the plugin's own environment", EnvDelegating)
	}
}
