package podman

import (
	"encoding/json"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
	kitns "github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/netns"
)

// gc --runtime podman against real podman: the ID podman gives CNI is the
// one `podman ps` lists, so a running container's attachment is kept,
// whatever the grace; an attachment of a container podman does not have
// (its namespace kept alive by a mount, as a crashed runtime leaves it) is
// remembered on the first list and released by a list a grace later.
func TestGCRuntimePodman(t *testing.T) {
	e := newEnv(t, oneWord)
	n := e.addNetwork(t, "a")
	c := e.run(t, "web", n)
	addr := e.checkServes(t, c, n, "eth0")

	// The leaked attachment: a namespace only its bind mount keeps, a
	// record and a lease of an ID podman never had, made an hour ago.
	nsPath := kitns.New(t, "nbc-leak").Path
	var st unix.Stat_t
	if err := unix.Stat(nsPath, &st); err != nil {
		t.Fatal(err)
	}
	d := ipamdir.New(e.tmpfs, n.name)
	leakedIP := n.gateway.Next().Next().Next().Next().Next()
	bootID, err := (&sysinfo.Real{}).BootID()
	if err != nil {
		t.Fatal(err)
	}
	const leakedID = "0000000000000000000000000000000000000000000000000000000000001eak"
	created := time.Now().Add(-time.Hour)
	if err := records.NewStore(d).Write(&records.Record{Version: records.FormatVersion, Network: n.name, ContainerID: leakedID, IfName: "eth0",
		Netns: nsPath, NetnsID: sysinfo.NetnsID{Dev: st.Dev, Ino: st.Ino}, BootID: bootID, Created: created, State: records.Complete,
		IPs: []string{netip.PrefixFrom(leakedIP, n.subnet.Bits()).String()}}); err != nil {
		t.Fatal(err)
	}
	lease := d.Lease(leakedIP.AsSlice())
	if err := os.WriteFile(lease, []byte(leakedID+"\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}

	// A second one whose recorded path is gone, its namespace kept only by
	// a bind mount elsewhere: what a runtime that crashed mid-teardown
	// leaves. --remove-mounts takes the mount too.
	mountedNS := kitns.New(t, "nbc-leak-m")
	mounted, mountPath := mountedNS.Name, mountedNS.Path
	if err := unix.Stat(mountPath, &st); err != nil {
		t.Fatal(err)
	}
	const mountedID = "00000000000000000000000000000000000000000000000000000000000m0unt"
	mountedIP := leakedIP.Next()
	if err := records.NewStore(d).Write(&records.Record{Version: records.FormatVersion, Network: n.name, ContainerID: mountedID, IfName: "eth0",
		Netns: mountPath + "-gone", NetnsID: sysinfo.NetnsID{Dev: st.Dev, Ino: st.Ino}, BootID: bootID, Created: created, State: records.Complete,
		IPs: []string{netip.PrefixFrom(mountedIP, n.subnet.Bits()).String()}}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.Lease(mountedIP.AsSlice()), []byte(mountedID+"\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}

	// podman's configuration: the test's store.
	operator := func(args ...string) cniexec.Result {
		t.Helper()
		r := cniexec.Run(t, e.operatorBin(), invoke.Args{}, cniexec.Opts{Argv: args, Base: e.environ(), Timeout: cmdTimeout})
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		return r
	}
	gc := func() string {
		t.Helper()
		r := operator("gc", "--runtime", "podman", "--grace", "1m", "--remove-mounts", "--data-dir", e.tmpfs, "--network", n.name)
		t.Logf("gc --runtime podman:\n%s%s", r.Stdout, r.Stderr)
		return r.Stdout
	}
	// leases --runtime podman: the running container is listed, the
	// leaked ones are not.
	{
		out := []byte(operator("leases", "--runtime", "podman", "--data-dir", e.tmpfs, "--network", n.name, "--json").Stdout)
		var doc struct {
			Leases []struct {
				ContainerID string `json:"containerID"`
				Runtime     string `json:"runtime"`
			} `json:"leases"`
		}
		if err := json.Unmarshal(out, &doc); err != nil {
			t.Fatalf("leases --json: %v\n%s", err, out)
		}
		want := map[string]string{c.id: "listed", leakedID: "not listed", mountedID: "not listed"}
		for _, r := range doc.Leases {
			if want[r.ContainerID] != r.Runtime {
				t.Errorf("leases --runtime: %s is %q, want %q", r.ContainerID, r.Runtime, want[r.ContainerID])
			}
			delete(want, r.ContainerID)
		}
		if len(want) > 0 {
			t.Errorf("leases --runtime has no row of %v:\n%s", want, out)
		}
	}
	if out := gc(); strings.Contains(out, "released") {
		t.Fatalf("the first list released something:\n%s", out)
	}
	// The first list was taken two minutes ago.
	marker := d.Marker(ipamdir.UnlistedMarker)
	b, err := os.ReadFile(marker)
	if err != nil {
		t.Fatalf("the first run remembered nothing: %v", err)
	}
	var state struct {
		Runtime      string               `json:"runtime"`
		MissingSince map[string]time.Time `json:"missingSince"`
	}
	if err := json.Unmarshal(b, &state); err != nil || state.Runtime != "podman" || len(state.MissingSince) != 2 {
		t.Fatalf("remembered %s (%v): want the two leaked attachments", b, err)
	}
	for k := range state.MissingSince {
		if k != leakedID+"@eth0" && k != mountedID+"@eth0" {
			t.Fatalf("remembered %s as missing: podman runs it", k)
		}
		state.MissingSince[k] = time.Now().Add(-2 * time.Minute)
	}
	b, _ = json.Marshal(state)
	if err := os.WriteFile(marker, b, 0o600); err != nil {
		t.Fatal(err)
	}

	out := gc()
	if !strings.Contains(out, "released "+n.name+" "+leakedID+"/eth0 "+leakedIP.String()+": not listed by podman since") {
		t.Errorf("the leaked attachment was not released:\n%s", out)
	}
	if _, err := os.Lstat(lease); err == nil {
		t.Error("the leaked lease is still there")
	}
	if !strings.Contains(out, "released "+n.name+" "+mountedID+"/eth0 "+mountedIP.String()+": not listed by podman since") ||
		!strings.Contains(out, "its namespace is still held by mount /run/netns/"+mounted) || !strings.Contains(out, "record, mount /run/netns/"+mounted) {
		t.Errorf("the attachment a mount kept was not released with its mount:\n%s", out)
	}
	if _, err := os.Lstat(mountPath); err == nil {
		t.Errorf("%s is still there", mountPath)
	}
	if strings.Contains(out, c.id) {
		t.Errorf("released the running container %s:\n%s", c.id, out)
	}
	e.assertLease(t, n, addr, c.id, "eth0")
	e.checkServes(t, c, n, "eth0")
}

// A pod's attachment is its infra container's: podman gives CNI that ID,
// and `podman ps --all` lists infra containers beside the others. So a
// running pod is listed: gc --runtime podman never counts it as missing,
// and its lease stays, whatever the grace.
func TestGCRuntimePodmanListsARunningPod(t *testing.T) {
	e := newEnv(t, oneWord)
	n := e.addNetwork(t, "p")
	pod := "pod-" + e.id
	e.mustPodman(t, "pod", "create", "--name", pod, "--network", n.name, "--infra-image", e.image, "--infra-command", "/bin/pause")
	infra := strings.TrimSpace(e.mustPodman(t, "pod", "inspect", "--format", "{{.InfraContainerID}}", pod))
	if infra == "" {
		t.Fatal("the pod has no infra container")
	}
	e.noteContainer(infra)
	e.mustPodman(t, "pod", "start", pod)
	var addr netip.Addr
	for a, content := range e.leases(t, n) {
		if content == infra+"\r\neth0" {
			addr = a
		}
	}
	if !addr.IsValid() {
		t.Fatalf("no lease names the pod's infra container %s: %v", infra, e.leases(t, n))
	}

	operator := func(args ...string) string {
		t.Helper()
		r := cniexec.Run(t, e.operatorBin(), invoke.Args{}, cniexec.Opts{Argv: args, Base: e.environ(), Timeout: cmdTimeout})
		if r.Err != nil {
			t.Fatalf("%v: %v\n%s%s", args, r.Err, r.Stdout, r.Stderr)
		}
		return r.Stdout
	}
	out := operator("leases", "--runtime", "podman", "--data-dir", e.tmpfs, "--network", n.name, "--json")
	if !strings.Contains(out, `"containerID": "`+infra+`"`) || strings.Contains(out, `"not listed"`) {
		t.Errorf("leases --runtime podman: the pod's infra container %s is not listed:\n%s", infra, out)
	}
	if out := operator("gc", "--runtime", "podman", "--grace", "1m", "--data-dir", e.tmpfs, "--network", n.name); strings.Contains(out, "released") {
		t.Errorf("gc --runtime podman released something of a running pod:\n%s", out)
	}
	if b, err := os.ReadFile(ipamdir.New(e.tmpfs, n.name).Marker(ipamdir.UnlistedMarker)); err == nil && strings.Contains(string(b), infra) {
		t.Errorf("gc --runtime podman remembered the running pod as missing: %s", b)
	}
	e.assertLease(t, n, addr, infra, "eth0")
}
