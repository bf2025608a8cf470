package skel

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/plugin"
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
	fifo := filepath.Join(dir, "netns")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
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
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestMainSwitchesSkelsNetnsCheckOffForItselfOnly$")
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "CNI_") && !strings.HasPrefix(kv, plugin.EnvDelegating+"=") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			cmd.Env = append(cmd.Env, asMain+"=1", "CNI_COMMAND=DEL", "CNI_CONTAINERID=c1", "CNI_IFNAME=eth0", "CNI_NETNS="+fifo, "CNI_PATH="+bin)
			if tc.set {
				cmd.Env = append(cmd.Env, plugin.EnvNetnsOverride+"="+tc.value)
			}
			cmd.Stdin = strings.NewReader(stdin)
			cmd.WaitDelay = time.Second
			out, err := cmd.CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("DEL with a FIFO as CNI_NETNS did not return: %s", out)
			}
			if err != nil {
				t.Fatalf("DEL: %v: %s", err, out)
			}
			got, err := os.ReadFile(seen)
			if err != nil {
				t.Fatalf("the delegate did not run: %v: %s", err, out)
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
