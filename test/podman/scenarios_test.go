package podman

import (
	"encoding/json"
	"strings"
	"testing"
)

// The lifecycle of a container with a published port works the same with
// the plugin, either way, as with bare bridge: every stop releases the
// address (lease, record, NAT rules), every start serves again.
func TestLifecycle(t *testing.T) {
	forEachAdoption(t, func(t *testing.T, a adoption) {
		e := newEnv(t, a)
		n := e.addNetwork(t, "a")
		c := e.run(t, "web", n, withHostPort(t))
		e.checkServes(t, c, n, "eth0")

		e.mustPodman(t, "stop", c.id)
		e.assertReleased(t, n, c.id, "eth0")
		assertNoRules(t, n, c.id)

		e.start(t, c)
		e.checkServes(t, c, n, "eth0")
		e.restart(t, c)
		e.checkServes(t, c, n, "eth0")

		e.mustPodman(t, "rm", "--force", "--time", "0", c.id)
		e.assertReleased(t, n, c.id, "eth0")
		assertNoRules(t, n, c.id)
	})
}

// After a reboot podman restores the container under the same ID. Bare
// bridge's leases outlived the boot and host-local refuses the ID's
// address ("duplicate allocation"); the plugin's died with the tmpfs.
func TestRestoreAfterReboot(t *testing.T) {
	forEachAdoption(t, func(t *testing.T, a adoption) {
		e := newEnv(t, a)
		n := e.addNetwork(t, "a")
		c := e.run(t, "web", n, withHostPort(t))
		e.checkServes(t, c, n, "eth0")

		e.reboot(t)
		if !a.plugin() {
			e.expectStartFails(t, c, "duplicate allocation is not allowed")
			return
		}
		e.start(t, c)
		if got := e.mustInspect(t, c.id).ID; got != c.id {
			t.Fatalf("restored container has ID %s, want %s", got, c.id)
		}
		e.checkServes(t, c, n, "eth0")
	})
}

// The container's namespace path vanishes under podman (its processes
// keep the namespace): podman cannot enter it to tear down, so it sends no
// DEL, and restarts the container in a new namespace under the same ID.
// Bare bridge still holds the old lease; the plugin proves the old
// attachment dead (path gone, nothing holds the namespace once podman
// stopped the container) and releases it first.
func TestRestartAfterLostNetns(t *testing.T) {
	forEachAdoption(t, func(t *testing.T, a adoption) {
		e := newEnv(t, a)
		n := e.addNetwork(t, "a")
		c := e.run(t, "web", n, withHostPort(t))
		before := e.checkServes(t, c, n, "eth0")
		lost := e.loseNetns(t, c)

		if !a.plugin() {
			e.expectFails(t, []string{"restart", c.id}, "duplicate allocation is not allowed")
			return
		}
		e.restart(t, c)
		after := e.checkServes(t, c, n, "eth0")
		if ns := e.mustInspect(t, c.id).NetworkSettings.SandboxKey; ns == lost {
			t.Errorf("restarted in the lost namespace path %s", ns)
		}
		if leases := e.leases(t, n); len(leases) != 1 {
			t.Errorf("leases after the restart (was %s, now %s): %q, want only the new one", before, after, leases)
		}
		assertMasqFrom(t, n, c.id, after)
	})
}

// A static address (--ip) across a reboot: bare bridge's lease of it
// outlived the boot, so host-local refuses it to the restored container;
// with the plugin the restored container gets it again.
func TestStaticIPAfterReboot(t *testing.T) {
	forEachAdoption(t, func(t *testing.T, a adoption) {
		e := newEnv(t, a)
		n := e.addNetwork(t, "a")
		static := nthAddr(n.subnet, 50)
		c := e.run(t, "web", n, withIP(static), withHostPort(t))
		if got := e.checkServes(t, c, n, "eth0"); got != static {
			t.Fatalf("container has %s, want the static %s", got, static)
		}

		e.reboot(t)
		if !a.plugin() {
			e.expectStartFails(t, c, "requested IP address "+static.String()+" is not available")
			return
		}
		e.start(t, c)
		if got := e.checkServes(t, c, n, "eth0"); got != static {
			t.Fatalf("restored container has %s, want the static %s", got, static)
		}
	})
}

// podman network connect and disconnect attach and detach a second
// network (eth1) to a running container; network reload tears down and
// sets up the container's networks again in the same namespace.
func TestConnectDisconnectReload(t *testing.T) {
	forEachAdoption(t, func(t *testing.T, a adoption) {
		e := newEnv(t, a)
		first := e.addNetwork(t, "a")
		second := e.addNetwork(t, "b")
		c := e.run(t, "web", first, withHostPort(t))
		e.checkServes(t, c, first, "eth0")

		e.mustPodman(t, "network", "connect", second.name, c.id)
		e.checkServes(t, c, second, "eth1")
		e.checkServes(t, c, first, "eth0")

		e.mustPodman(t, "network", "disconnect", second.name, c.id)
		e.assertReleased(t, second, c.id, "eth1")
		assertNoRules(t, second, c.id)
		assertNoIf(t, e.mustInspect(t, c.id).NetworkSettings.SandboxKey, "eth1")
		e.checkServes(t, c, first, "eth0")

		e.mustPodman(t, "network", "reload", c.id)
		reloaded := e.checkServes(t, c, first, "eth0")
		assertMasqFrom(t, first, c.id, reloaded)
		if leases := e.leases(t, first); len(leases) != 1 {
			t.Errorf("leases after reload: %q, want one", leases)
		}
	})
}

// podman's CNI backend reads a network's subnet, gateway and bridge from
// its first plugin only when that plugin's type is "bridge". Installed as
// `bridge`, the plugin keeps that; with the one-word edit podman knows
// none of them (the documented limits: no subnet, gateway or bridge in
// inspect, none avoided by `podman network create`, --ip not checked by
// podman: host-local refuses an address outside the range at ADD).
func TestNetworkInspect(t *testing.T) {
	forEachAdoption(t, func(t *testing.T, a adoption) {
		e := newEnv(t, a)
		n := e.addNetwork(t, "a")
		var nets []struct {
			Driver           string `json:"driver"`
			NetworkInterface string `json:"network_interface"`
			Subnets          []struct {
				Subnet  string `json:"subnet"`
				Gateway string `json:"gateway"`
			} `json:"subnets"`
		}
		out := e.mustPodman(t, "network", "inspect", n.name)
		if err := json.Unmarshal([]byte(out), &nets); err != nil || len(nets) != 1 {
			t.Fatalf("podman network inspect: %d networks, %v: %s", len(nets), err, out)
		}
		got := nets[0]
		outside := nthAddr(pickSubnet(t), 10)
		e.mustPodman(t, "create", "--name", "outside-"+e.id, "--network", n.name, "--ip", outside.String(), e.image, "true")
		if a == oneWord {
			if got.Driver != pluginType || len(got.Subnets) != 0 || got.NetworkInterface != "" {
				t.Fatalf("podman network inspect: driver %q, interface %q, subnets %+v; want driver %s and neither (podman reads them from type bridge only)", got.Driver, got.NetworkInterface, got.Subnets, pluginType)
			}
			e.expectFails(t, []string{"start", "outside-" + e.id}, "failed to allocate all requested IPs: "+outside.String())
			return
		}
		if got.Driver != "bridge" || got.NetworkInterface != n.bridge || len(got.Subnets) != 1 ||
			got.Subnets[0].Subnet != n.subnet.String() || got.Subnets[0].Gateway != n.gateway.String() {
			t.Fatalf("podman network inspect: driver %q, interface %q, subnets %+v; want bridge, %s, %s via %s", got.Driver, got.NetworkInterface, got.Subnets, n.bridge, n.subnet, n.gateway)
		}
		e.expectFails(t, []string{"start", "outside-" + e.id}, "requested static ip "+outside.String()+" not in any subnet on network "+n.name)
	})
}

// expectStartFails runs `podman start` on c and requires it to fail with
// want in the error (the control's answer: if bare bridge restored the
// container too, the test would prove nothing).
func (e *env) expectStartFails(t *testing.T, c *container, want string) {
	t.Helper()
	e.expectFails(t, []string{"start", c.id}, want)
}

// expectFails runs podman with args and requires it to fail with want in
// the error.
func (e *env) expectFails(t *testing.T, args []string, want string) {
	t.Helper()
	_, err := e.podman(args...)
	if err == nil {
		t.Fatalf("podman %s succeeded, want it to fail with %q", strings.Join(args, " "), want)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("podman %s failed, but not with %q: %v", strings.Join(args, " "), want, err)
	}
	t.Logf("failed as expected: %v", err)
}
