package skel

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/plugin"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/dirstate"
)

// asMain makes the test binary run Main, as the plugin's process.
const asMain = "NBC_SKEL_TEST_AS_MAIN"

// Upstream skel's own-namespace check is off for the plugin's process: it
// would open CNI_NETNS after the DEL, and a FIFO there would block it for
// ever. The delegate gets exactly the CNI_NETNS_OVERRIDE the runtime set,
// or none.
func TestMainSwitchesSkelsNetnsCheckOffForItselfOnly(t *testing.T) {
	if os.Getenv(asMain) == "1" {
		os.Exit(Main(nil))
	}
	dir := t.TempDir()
	seen := filepath.Join(dir, "seen")
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	delegate := "#!/bin/sh\nprintf '%s' \"${" + plugin.EnvNetnsOverride + "-none}\" > " + seen + "\n"
	if err := os.WriteFile(filepath.Join(bin, "bridge"), []byte(delegate), 0o755); err != nil {
		t.Fatal(err)
	}
	fifo := dirstate.PlantFIFO(t, filepath.Join(dir, "netns"))
	// An entry the plugin installed as bridge passes through: nothing but
	// the delegate runs.
	stdin := `{"cniVersion":"1.0.0","name":"podman","type":"bridge","bridge":"cni-podman1","ipam":{"type":"static","addresses":[{"address":"172.26.64.2/20"}]}}`
	for _, tc := range []struct {
		name, value string
		set         bool
	}{
		{name: "unset"},
		{name: "empty", set: true},
		{name: "0", value: "0", set: true},
		{name: "false", value: "false", set: true},
		{name: "true", value: "true", set: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_ = os.Remove(seen)
			env := []string{asMain + "=1", plugin.EnvDelegating}
			if tc.set {
				env = append(env, plugin.EnvNetnsOverride+"="+tc.value)
			}
			r := cniexec.Run(t, os.Args[0], invoke.Args{Command: "DEL", ContainerID: "c1", IfName: "eth0", NetNS: fifo, Path: bin},
				cniexec.Opts{Argv: []string{"-test.run=^TestMainSwitchesSkelsNetnsCheckOffForItselfOnly$"}, Stdin: []byte(stdin), Env: env, Timeout: 20 * time.Second, Combined: true})
			if r.Killed {
				t.Fatalf("DEL with a FIFO as CNI_NETNS did not return: %s", r)
			}
			if r.Err != nil {
				t.Fatalf("DEL: %v", r.Err)
			}
			got, err := os.ReadFile(seen)
			if err != nil {
				t.Fatalf("the delegate did not run: %v: %s", err, r.Stdout)
			}
			want := tc.value
			if !tc.set {
				want = "none"
			}
			if string(got) != want {
				t.Errorf("the delegate got %s=%q, want %q (the runtime's)", plugin.EnvNetnsOverride, got, want)
			}
		})
	}
}
