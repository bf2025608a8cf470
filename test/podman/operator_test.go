package podman

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/hostcmd"
)

// leasesDoc is what the tests read of `nomad-bridge-cni leases --json`.
type leasesDoc struct {
	DataDir string     `json:"dataDir"`
	Leases  []leaseRow `json:"leases"`
}

type leaseRow struct {
	Network     string `json:"network"`
	IP          string `json:"ip"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	State       string `json:"state"`
	Reason      string `json:"reason"`
}

// rowsOf lists the rows of container id.
func (d leasesDoc) rowsOf(id string) []leaseRow {
	var out []leaseRow
	for _, r := range d.Leases {
		if r.ContainerID == id {
			out = append(out, r)
		}
	}
	return out
}

// gcDoc is what the tests read of `nomad-bridge-cni gc --json`.
type gcDoc struct {
	DryRun   bool `json:"dryRun"`
	Released []struct {
		Network     string   `json:"network"`
		ContainerID string   `json:"containerID"`
		IfName      string   `json:"ifName"`
		IPs         []string `json:"ips"`
		Reason      string   `json:"reason"`
		Removed     []string `json:"removed"`
	} `json:"released"`
	Problems []string `json:"problems"`
}

// operatorRunner runs the plugin's operator commands (leases, gc) one way
// or another, returning stdout and stderr.
type operatorRunner func(args ...string) (string, string, error)

// operatorBin is the env's plugin binary: in the last of its plugin
// directories, a rootless env's own copy or NBC_BIN_DIR's.
func (e *env) operatorBin() string {
	return filepath.Join(e.pluginDirs[len(e.pluginDirs)-1], pluginType)
}

// operatorOnHost runs the env's plugin binary as root on the host.
func (e *env) operatorOnHost(args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	bin := e.operatorBin()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = hostcmd.CNIEnv()
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), stderr.String(), err
}

// operatorJSON runs an operator command with --json through run, logs what
// it printed and decodes its output into v.
func operatorJSON(t *testing.T, run operatorRunner, v any, args ...string) {
	t.Helper()
	args = append(args, "--json")
	stdout, stderr, err := run(args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("nomad-bridge-cni %s:\n%s%s", strings.Join(args, " "), stdout, stderr)
	if err := json.Unmarshal([]byte(stdout), v); err != nil {
		t.Fatalf("nomad-bridge-cni %s: parse its JSON: %v", strings.Join(args, " "), err)
	}
}
