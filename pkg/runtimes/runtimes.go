// Package runtimes asks a container runtime which containers it has, for
// `gc --runtime`: the attachments of containers it does not list, past a
// grace period, are released even while the kernel still keeps their
// namespace (a mount a crashed runtime leaked). The operator's command uses
// it; the CNI verbs never do.
package runtimes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// Listing is what a runtime said it has.
type Listing struct {
	// IDs are the CNI container IDs of what it runs or is setting up.
	IDs map[string]bool
}

// Lister asks one runtime.
type Lister interface {
	List(ctx context.Context) (*Listing, error)
}

// Names are the runtimes gc --runtime knows.
var Names = []string{"podman", "nomad", "cri"}

// New is the lister of a runtime: its own CLI, which reads its settings as
// it always does (NOMAD_ADDR, NOMAD_TOKEN and the TLS settings,
// CONTAINER_RUNTIME_ENDPOINT or /etc/crictl.yaml, podman's containers.conf):
// a client linked into the plugin would cost every CNI verb its start-up
// (an HTTP client: 3 MB more to page in).
func New(name string) (Lister, error) {
	listers := map[string]Lister{"podman": &Podman{Command: "podman"}, "nomad": &Nomad{Command: "nomad"}, "cri": &CRI{Command: "crictl"}}
	if l, ok := listers[name]; ok {
		return l, nil
	}
	return nil, fmt.Errorf("unknown runtime %q: one of %s", name, strings.Join(Names, ", "))
}

// Podman lists podman's containers (podman ps --all): the ID podman gives
// CNI is the container's (a pod's infra container's). One that exited has
// had its network torn down, or should have: it is not listed. Its state
// is read from podman's JSON, never from {{.State}}, which is the
// human-readable status ("Up 2 hours", "Exited (0) 5 minutes ago"); and
// that JSON is a list even when podman has no container ("[]"), so output
// that is none is an error, never "nothing runs".
type Podman struct{ Command string }

func (p *Podman) List(ctx context.Context) (*Listing, error) {
	out, err := output(ctx, p.Command, "ps", "--all", "--no-trunc", "--format", "json")
	if err != nil {
		return nil, err
	}
	var containers []struct {
		ID    string `json:"Id"`
		State string `json:"State"`
	}
	if err := json.Unmarshal(out, &containers); err != nil || containers == nil {
		return nil, fmt.Errorf("podman ps --format json printed no list of containers (%v): %.200q", err, out)
	}
	l := &Listing{IDs: map[string]bool{}}
	for _, c := range containers {
		switch {
		case c.ID == "":
			return nil, errors.New("podman ps listed a container without an ID")
		case slices.Contains([]string{"exited", "stopped", "dead", "removing"}, strings.ToLower(c.State)):
			continue
		}
		l.IDs[c.ID] = true // created, initialized, running, paused, stopping, unknown
	}
	return l, nil
}

// CRI lists the pod sandboxes of a CRI runtime (containerd, CRI-O) through
// crictl. The sandbox ID is the container ID the runtime gives CNI; a
// sandbox that is not ready has had its network torn down, or should have:
// it is not listed.
type CRI struct{ Command string }

func (c *CRI) List(ctx context.Context) (*Listing, error) {
	return listLines(ctx, func(id string) (string, error) {
		if strings.ContainsAny(id, " \t") {
			return "", fmt.Errorf("crictl pods printed %q, not a sandbox ID", id)
		}
		return id, nil
	}, c.Command, "pods", "--state", "ready", "--quiet", "--no-trunc")
}

// listLines runs a runtime's CLI and lists the container that id reads
// in each line it printed (blank ones left out; "": one not listed).
func listLines(ctx context.Context, id func(line string) (string, error), command string, args ...string) (*Listing, error) {
	out, err := output(ctx, command, args...)
	if err != nil {
		return nil, err
	}
	l := &Listing{IDs: map[string]bool{}}
	for line := range strings.Lines(string(out)) {
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		listed, err := id(line)
		if err != nil {
			return nil, err
		}
		if listed != "" {
			l.IDs[listed] = true
		}
	}
	return l, nil
}

// output runs a runtime's CLI and returns what it printed on stdout; a
// failure carries what it said on stderr.
func output(ctx context.Context, command string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, command, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = time.Second // a child left holding its output
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", command, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// Nomad lists the allocations the local agent's node runs, through the
// agent's HTTP API asked by the nomad CLI (`nomad operator api`). The
// allocation ID is the container ID Nomad gives CNI. A pending, running or
// unknown allocation is listed (an unknown one is on a client the servers
// lost touch with: its tasks may still run here); one that is complete,
// failed or lost is not.
type Nomad struct{ Command string }

func (n *Nomad) List(ctx context.Context) (*Listing, error) {
	var self struct {
		Stats struct {
			Client struct {
				NodeID string `json:"node_id"`
			} `json:"client"`
		} `json:"stats"`
	}
	if err := n.get(ctx, "/v1/agent/self", &self); err != nil {
		return nil, err
	}
	node := self.Stats.Client.NodeID
	if node == "" {
		return nil, errors.New("the nomad agent runs no client (no stats.client.node_id): it has no allocations here")
	}
	var allocs []struct {
		ID           string `json:"ID"`
		ClientStatus string `json:"ClientStatus"`
	}
	if err := n.get(ctx, "/v1/node/"+node+"/allocations", &allocs); err != nil {
		return nil, err
	}
	l := &Listing{IDs: map[string]bool{}}
	for _, a := range allocs {
		if a.ID == "" {
			return nil, errors.New("nomad listed an allocation without an ID")
		}
		if a.ClientStatus == "pending" || a.ClientStatus == "running" || a.ClientStatus == "unknown" {
			l.IDs[a.ID] = true
		}
	}
	return l, nil
}

// API asks the agent's HTTP API for path (`nomad operator api`).
func (n *Nomad) API(ctx context.Context, path string) ([]byte, error) {
	return output(ctx, n.Command, "operator", "api", path)
}

func (n *Nomad) get(ctx context.Context, path string, into any) error {
	out, err := n.API(ctx, path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(out, into); err != nil {
		return fmt.Errorf("nomad operator api %s: %w", path, err)
	}
	return nil
}
