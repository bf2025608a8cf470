package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/hostcmd"
	kitns "github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/netns"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

const (
	pluginType = "nomad-bridge-cni"
	// delegateType is what A and C delegate to, and what B runs bare.
	delegateType = "bridge"
	ifName       = "eth0"
	netnsDir     = kitns.Dir
	cmdTimeout   = 120 * time.Second
)

type options struct {
	bin, repo, work, id, out  string
	minimal, floor            string
	command                   string
	pairs, rounds, parallel   int
	coldPairs, releaseReps    int
	nodeReps                  int
	sizes, reps, only         string
	restoreSizes, restoreReps string
	budget                    time.Duration
}

// variant is one side of a comparison: A (the plugin), B (bare bridge) or
// C (bridge behind the floor plugin, test/bench/cmd/floor).
type variant struct {
	label    string // "A", "B" or "C"
	netName  string
	bridge   string
	subnet   netip.Prefix
	dataDir  string // the plugin's dataDir (A) or ipam.dataDir (B, C)
	confList []byte
}

// Env owns everything a run creates. Every name is derived from the run ID
// and written to the state file before the thing exists.
type Env struct {
	o     options
	ctx   context.Context
	mu    sync.Mutex
	state *os.File
	tmpfs string
	a, b  *variant
	// c is nil without --floor.
	c *variant
	// liveNetns is the namespace every "live" synthetic record names.
	liveNetns string
	// deadline ends the sweep benchmark's optional rounds.
	deadline time.Time
	nsSeq    int
}

func newEnv(o options) (*Env, error) {
	if err := os.MkdirAll(o.work, 0o755); err != nil {
		return nil, err
	}
	st, err := os.OpenFile(filepath.Join(o.work, "state"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	e := &Env{o: o, state: st, tmpfs: filepath.Join(o.work, "tmpfs")}
	e.note("id", o.id)
	snapshotHost(e)
	return e, nil
}

// note appends one line to the state file: what cleanup must undo.
func (e *Env) note(kind string, vals ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	fmt.Fprintln(e.state, kind+"\t"+strings.Join(vals, "\t"))
	e.state.Sync()
}

func (e *Env) canceled() error {
	if err := e.ctx.Err(); err != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	return nil
}

// setup mounts the run's tmpfs and writes the conflists (two, or three
// with --floor).
func (e *Env) setup() error {
	if e.a != nil {
		return nil
	}
	if err := os.MkdirAll(e.tmpfs, 0o755); err != nil {
		return err
	}
	e.note("mount", e.tmpfs)
	// Sized for the largest sweep directories (65534 leases + records,
	// one page each on tmpfs, several networks at once); pages are only
	// used as files are written.
	if err := run("mount", "-t", "tmpfs", "-o", "size=4g,mode=0755", "nbcb-"+e.o.id, e.tmpfs); err != nil {
		return err
	}
	labels := []string{"A", "B"}
	if e.o.floor != "" {
		labels = append(labels, "C")
	}
	subnets, err := pickSubnets(len(labels))
	if err != nil {
		return err
	}
	var vs []*variant
	for i, label := range labels {
		l := strings.ToLower(label)
		vs = append(vs, &variant{label: label, netName: "nbcb-" + e.o.id + "-" + l, bridge: "nbcb" + e.o.id + l, subnet: subnets[i], dataDir: filepath.Join(e.tmpfs, l)})
	}
	e.a, e.b = vs[0], vs[1]
	if len(vs) == 3 {
		e.c = vs[2]
	}
	for _, v := range vs {
		e.note("network", v.netName)
		e.note("bridge", v.bridge)
		e.note("subnet", v.subnet.String())
		e.note("adminchain", adminChain(v))
		if err := os.MkdirAll(v.dataDir, 0o755); err != nil {
			return err
		}
		conf, err := e.conflist(v)
		if err != nil {
			return err
		}
		v.confList = conf
		if err := os.WriteFile(filepath.Join(e.o.work, v.netName+".conflist"), conf, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func adminChain(v *variant) string { return "NBCB-ADM-" + strings.TrimPrefix(v.bridge, "nbcb") }

// conflist is conflist/nomad.conflist made the run's own: network name,
// bridge, subnet, firewall admin chain, and the tmpfs as dataDir. For B the
// entry becomes bare "bridge" with ipam.dataDir on the same tmpfs; C is B
// with the floor plugin as the entry's type, delegating to bridge.
func (e *Env) conflist(v *variant) ([]byte, error) {
	raw, err := os.ReadFile(filepath.Join(e.o.repo, "conflist", "nomad.conflist"))
	if err != nil {
		return nil, err
	}
	var conf map[string]any
	if err := json.Unmarshal(raw, &conf); err != nil {
		return nil, err
	}
	conf["name"] = v.netName
	plugins, _ := conf["plugins"].([]any)
	found := false
	for _, p := range plugins {
		m, _ := p.(map[string]any)
		switch m["type"] {
		case pluginType:
			found = true
			m["bridge"] = v.bridge
			ipam, _ := m["ipam"].(map[string]any)
			if ipam == nil {
				return nil, errors.New("nomad.conflist: plugin entry has no ipam")
			}
			ipam["ranges"] = []any{[]any{map[string]any{"subnet": v.subnet.String()}}}
			switch v.label {
			case "A":
				m["dataDir"] = v.dataDir
			case "B":
				m["type"] = delegateType
				delete(m, "dataDir")
				delete(m, "delegate")
				ipam["dataDir"] = v.dataDir
			case "C":
				m["type"] = e.floorType()
				m["delegate"] = delegateType
				delete(m, "dataDir")
				ipam["dataDir"] = v.dataDir
			}
		case "firewall":
			m["iptablesAdminChainName"] = adminChain(v)
		}
	}
	if !found {
		return nil, fmt.Errorf("nomad.conflist has no %q entry", pluginType)
	}
	return json.MarshalIndent(conf, "", "  ")
}

// pickSubnets chooses n /24s in 10.200.0.0-10.249.255.0 (clear of the
// e2e suite's 10.100-10.199) that overlap nothing routed on the host.
func pickSubnets(n int) ([]netip.Prefix, error) {
	pool := &testhost.Subnets{Second10: [2]int{200, 250}}
	var out []netip.Prefix
	for range n {
		p, err := pool.IPv4()
		if err != nil {
			return nil, fmt.Errorf("pick a /24: %w", err)
		}
		out = append(out, p)
	}
	return out, nil
}

// floorType is the floor plugin's CNI type: its file name, found by libcni
// in its own directory (see cni).
func (e *Env) floorType() string { return filepath.Base(e.o.floor) }

// addNetns creates a fresh named namespace and returns its path.
func (e *Env) addNetns(tag string) (string, string, error) {
	e.mu.Lock()
	e.nsSeq++
	name := fmt.Sprintf("nbcb-%s-%s%04d", e.o.id, tag, e.nsSeq)
	e.mu.Unlock()
	e.note("netns", name)
	ns := kitns.Named(name)
	return name, ns.Path, ns.Add()
}

func delNetns(name string) error {
	ns := kitns.Named(name)
	if _, err := os.Stat(ns.Path); err != nil {
		return nil
	}
	return ns.Delete()
}

// containerID names a container of the run; it goes to the state file so
// cleanup can compute the chains bridge and portmap name after it.
func (e *Env) containerID(v *variant, tag string) string {
	cid := fmt.Sprintf("nbcb%s%s-%s", e.o.id, strings.ToLower(v.label), tag)
	e.note("cid", v.netName, cid)
	return cid
}

func run(name string, args ...string) error { return hostcmd.Run(cmdTimeout, name, args...) }

func output(name string, args ...string) (string, error) {
	return hostcmd.Output(cmdTimeout, name, args...)
}

// cniEnv: see hostcmd.CNIEnv.
var cniEnv = hostcmd.CNIEnv
