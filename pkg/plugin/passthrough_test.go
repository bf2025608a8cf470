package plugin

import (
	"os"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
)

// Installed as bridge, an entry with an IPAM the plugin does not manage
// reaches bridge byte for byte on every verb, and nothing else happens:
// reclaim gets no host, so touching any state would panic.
func TestEntriesItDoesNotManagePassThrough(t *testing.T) {
	h := newHarness(t, "bridge")
	h.plugin.Reclaim = reclaim.Env{}
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
