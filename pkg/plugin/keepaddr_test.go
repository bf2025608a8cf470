package plugin

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

// restoreInPlace makes h's first ADD (address 172.26.64.2, its lease as
// host-local writes it), then replaces the namespace at the same path, as
// Nomad does before its re-ADD; the calls so far are forgotten.
func (h *harness) restoreInPlace(extra string) {
	h.t.Helper()
	h.exec.reply["bridge ADD"] = bridgeResult100
	if err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", extra))); err != nil {
		h.t.Fatal(err)
	}
	lease := filepath.Join(h.dataDir, "nomad", "172.26.64.2")
	mkdir(h.t, filepath.Dir(lease))
	if err := os.WriteFile(lease, []byte("c1\r\neth0"), 0o600); err != nil {
		h.t.Fatal(err)
	}
	h.host.Namespaces["/var/run/netns/x"] = sysinfo.NetnsID{Dev: 4, Ino: 2000}
	h.exec.calls = nil
	h.stdout.Reset()
}

// requestedIPs is what a delegate call asks host-local for (args.cni.ips).
func requestedIPs(t *testing.T, call execCall) []string {
	t.Helper()
	args, _ := delegatedConf(t, call)["args"].(map[string]any)
	cni, _ := args["cni"].(map[string]any)
	list, _ := cni["ips"].([]any)
	var out []string
	for _, ip := range list {
		out = append(out, ip.(string))
	}
	return out
}

func commands(calls []execCall) []string {
	var out []string
	for _, c := range calls {
		out = append(out, c.Plugin+" "+c.Command)
	}
	return out
}

// A restore in place asks host-local for the released attachment's
// address again, next to the entry's own args.
func TestRestoreInPlaceAsksForTheEarlierAddress(t *testing.T) {
	h := newHarness(t, "bridge")
	h.restoreInPlace(`,"args":{"labels":{"a":"b"}}`)
	if err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", `,"args":{"labels":{"a":"b"}}`))); err != nil {
		t.Fatalf("re-ADD: %v", err)
	}
	call := h.exec.only(t)
	if got := requestedIPs(t, call); !slices.Equal(got, []string{"172.26.64.2"}) {
		t.Errorf("re-ADD asked for %q, want [172.26.64.2]:\n%s", got, call.Stdin)
	}
	if args := delegatedConf(t, call)["args"].(map[string]any); args["labels"] == nil {
		t.Errorf("the entry's own args were lost: %s", call.Stdin)
	}
	if r := h.record(); r == nil || r.NetnsID.Ino != 2000 {
		t.Errorf("record = %+v", r)
	}
}

// When bridge fails with the earlier address (taken since, or outside the
// ranges now), what it made is undone and the ADD is made asking for
// nothing; the container gets an address either way.
func TestRestoreInPlaceFallsBackToAnyAddress(t *testing.T) {
	h := newHarness(t, "bridge")
	h.restoreInPlace("")
	h.exec.failIf = func(c execCall) error {
		if c.Command == "ADD" && strings.Contains(c.Stdin, `"ips"`) {
			return types.NewError(types.ErrInternal, "failed to allocate for range 0: requested IP address 172.26.64.2 is not available in range set 172.26.64.1-172.26.79.254", "")
		}
		return nil
	}
	if err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", ""))); err != nil {
		t.Fatalf("re-ADD: %v", err)
	}
	if got := commands(h.exec.calls); !slices.Equal(got, []string{"bridge ADD", "bridge DEL", "bridge ADD"}) {
		t.Fatalf("delegate calls %q, want ADD asking, DEL, ADD", got)
	}
	if got := requestedIPs(t, h.exec.calls[2]); len(got) != 0 {
		t.Errorf("the second ADD still asked for %q", got)
	}
	for _, c := range h.exec.calls {
		if c.Inherited == nil {
			t.Errorf("%s %s ran without the record's lock", c.Plugin, c.Command)
		}
	}
	if !strings.Contains(h.stderr.String(), "could not be had again") {
		t.Errorf("fallback not said: %q", h.stderr.String())
	}
	if r := h.record(); r == nil || r.State != "complete" {
		t.Errorf("record = %+v", r)
	}
}

// Nothing is asked for an address another lease holds, nor when the
// runtime or the entry asks for addresses itself.
func TestRestoreInPlaceAsksNothingTheRuntimeDecides(t *testing.T) {
	for _, c := range []struct {
		name, extra, cniArgs string
		taken                bool
	}{
		{name: "taken", taken: true},
		{name: "cni-args-ip", cniArgs: "IgnoreUnknown=true;IP=172.26.64.9"},
		{name: "runtime-config-ips", extra: `,"runtimeConfig":{"ips":["172.26.64.9/20"]}`},
		{name: "args-cni-ips", extra: `,"args":{"cni":{"ips":["172.26.64.9"]}}`},
		{name: "args-not-an-object", extra: `,"args":"x"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, "bridge")
			h.restoreInPlace(c.extra)
			if c.taken {
				// The file of the earlier address names another container:
				// the release leaves it, and it is not asked for.
				if err := os.WriteFile(filepath.Join(h.dataDir, "nomad", "172.26.64.2"), []byte("other\r\neth0"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			args := h.args(h.conf("1.0.0", c.extra))
			args.Args = c.cniArgs
			if err := h.plugin.Funcs().Add(args); err != nil {
				t.Fatalf("re-ADD: %v", err)
			}
			call := h.exec.only(t)
			if got := requestedIPs(t, call); len(got) > 0 && !slices.Equal(got, []string{"172.26.64.9"}) {
				t.Errorf("asked for %q:\n%s", got, call.Stdin)
			}
			if c.extra == "" && strings.Contains(call.Stdin, `"args"`) {
				t.Errorf("args added: %s", call.Stdin)
			}
		})
	}
}
