package containerd

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// pod is a pod sandbox the env ran through CRI.
type pod struct {
	id    string
	netns string
	pid   int
	addrs []netip.Addr // IPv4 first, then IPv6
}

// runPod runs a pod sandbox with `crictl runp`, from a sandbox config of a
// unique name, uid and namespace, and waits for it to be ready.
func (e *env) runPod(t *testing.T, name string) *pod {
	t.Helper()
	cfg := map[string]any{
		"metadata": map[string]any{
			"name":      name + "-" + e.id,
			"namespace": "nbcd-" + e.id,
			"uid":       fmt.Sprintf("%s-%s", e.id, name),
			"attempt":   0,
		},
		"log_directory": filepath.Join(e.base, "logs", name),
		"linux":         map[string]any{},
	}
	path := filepath.Join(e.base, "pod-"+name+".json")
	if err := os.WriteFile(path, mustJSON(t, cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := e.crictl("runp", path)
	if id := strings.TrimSpace(out); id != "" {
		e.notePod(id)
	}
	if err != nil {
		t.Fatalf("%v\n%s", err, e.logTail())
	}
	p := e.inspectPod(t, strings.TrimSpace(out))
	if p.state != "SANDBOX_READY" {
		t.Fatalf("pod %s is %s after runp, want SANDBOX_READY", p.id, p.state)
	}
	if len(p.addrs) != 2 || !p.addrs[0].Is4() || !p.addrs[1].Is6() {
		t.Fatalf("pod %s has addresses %v, want an IPv4 and an IPv6 (dual stack)", p.id, p.addrs)
	}
	if !e.subnet4.Contains(p.addrs[0]) || !e.subnet6.Contains(p.addrs[1]) {
		t.Fatalf("pod %s has addresses %v, outside %s and %s", p.id, p.addrs, e.subnet4, e.subnet6)
	}
	t.Logf("pod %s: %s, netns %s, pause pid %d", name, p.id, p.netns, p.pid)
	return &p.pod
}

type inspected struct {
	pod
	state string
}

// inspectPod reads `crictl inspectp`: the state, addresses (the CRI
// plugin's record of what CNI answered at ADD), netns path and pause pid.
func (e *env) inspectPod(t *testing.T, id string) inspected {
	t.Helper()
	out := e.mustCrictl(t, "inspectp", "--output", "json", id)
	var v struct {
		Status struct {
			ID      string `json:"id"`
			State   string `json:"state"`
			Network struct {
				IP            string `json:"ip"`
				AdditionalIPs []struct {
					IP string `json:"ip"`
				} `json:"additionalIps"`
			} `json:"network"`
		} `json:"status"`
		Info struct {
			Pid         int `json:"pid"`
			RuntimeSpec struct {
				Linux struct {
					Namespaces []struct {
						Type string `json:"type"`
						Path string `json:"path"`
					} `json:"namespaces"`
				} `json:"linux"`
			} `json:"runtimeSpec"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("parse crictl inspectp %s: %v\n%s", id, err, out)
	}
	p := inspected{pod: pod{id: v.Status.ID, pid: v.Info.Pid}, state: v.Status.State}
	ips := []string{v.Status.Network.IP}
	for _, a := range v.Status.Network.AdditionalIPs {
		ips = append(ips, a.IP)
	}
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil {
			p.addrs = append(p.addrs, a)
		}
	}
	for _, ns := range v.Info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" {
			p.netns = ns.Path
		}
	}
	e.noteNetns(p.netns)
	e.notePause(p.pid)
	return p
}

// stopAndRemove is kubelet's end of a pod: stopp, then rmp.
func (e *env) stopAndRemove(t *testing.T, p *pod) {
	t.Helper()
	e.mustCrictl(t, "stopp", p.id)
	e.mustCrictl(t, "rmp", p.id)
	if out := e.mustCrictl(t, "pods", "--quiet"); slices.Contains(strings.Fields(out), p.id) {
		t.Fatalf("pod %s still listed after rmp", p.id)
	}
}

func (e *env) notePod(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !slices.Contains(e.pods, id) {
		e.pods = append(e.pods, id)
	}
}

func (e *env) noteNetns(path string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if path != "" && !slices.Contains(e.netnsPaths, path) {
		e.netnsPaths = append(e.netnsPaths, path)
	}
}

func (e *env) notePause(pid int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if pid > 0 && !slices.Contains(e.pausePIDs, pid) {
		e.pausePIDs = append(e.pausePIDs, pid)
	}
}
