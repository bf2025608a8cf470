package reclaim

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

// staleWithFirewall makes a container whose namespace is gone, with the
// firewall plugin's rules for its address, next to a live one's.
func (w *world) staleWithFirewall(cid, ip string) {
	w.t.Helper()
	w.container(cid, ip)
	delete(w.host.Namespaces, "/run/netns/"+cid)
	w.nat.AddForward(ip)
}

// plantLease writes a lease of another container at ip in network net
// under dataDir.
func plantLease(t *testing.T, dataDir, net, ip string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dataDir, net), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dataDir, net, ip), []byte("someone-else\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A released attachment's firewall rules go with it when no other network
// leases its address; another network on the same subnet (in this data
// dir, or the legacy one) keeps them, and the release and the counts say
// so. The rest of the attachment goes either way. Its own lease, seen
// through another name of the data dir (/var/run/cni is /run/cni), keeps
// nothing (regression: it kept them as another network's, and once the
// lease went no sweep could name them).
func TestReleaseTakesFirewallRulesOfFreeAddressesOnly(t *testing.T) {
	for _, where := range []string{"nowhere", "same-data-dir", "legacy", "behind-a-link", "own-data-dir-by-another-name"} {
		t.Run(where, func(t *testing.T) {
			w := newWorld(t)
			w.container("live", "10.0.0.2")
			w.nat.AddForward("10.0.0.2")
			w.staleWithFirewall("gone", "10.0.0.3")
			legacy := t.TempDir()
			switch where {
			case "same-data-dir":
				plantLease(t, w.dataDir, "other-net", "10.0.0.3")
			case "legacy":
				plantLease(t, legacy, "bare-net", "10.0.0.3")
			case "behind-a-link":
				// A planted link is never followed out of the data dir.
				outside := t.TempDir()
				plantLease(t, outside, "net", "10.0.0.3")
				if err := os.Symlink(filepath.Join(outside, "net"), filepath.Join(w.dataDir, "linked-net")); err != nil {
					t.Fatal(err)
				}
			}
			var others []string
			if where == "own-data-dir-by-another-name" {
				alias := filepath.Join(t.TempDir(), "run-cni")
				if err := os.Symlink(w.dataDir, alias); err != nil {
					t.Fatal(err)
				}
				others = append(others, alias)
			}
			rep := w.sweep(Request{LegacyDataDir: legacy, OtherDataDirs: others})
			if rep.Released != 1 || w.hasRecord("gone") || slices.Contains(w.leases(), "10.0.0.3") {
				t.Fatalf("released %d; leases %v", rep.Released, w.leases())
			}
			rel := rep.Releases[0]
			kept := where == "same-data-dir" || where == "legacy"
			if got, want := w.nat.Forwards(), map[bool][]string{false: {"10.0.0.2"}, true: {"10.0.0.2", "10.0.0.3"}}[kept]; !slices.Equal(got, want) {
				t.Errorf("firewall rules left for %q, want %q", got, want)
			}
			if gone := slices.Contains(rel.What, "firewall rules of 10.0.0.3 in CNI-FORWARD (2)"); gone == kept {
				t.Errorf("release removed %q", rel.What)
			}
			if kept != (len(rel.Kept) == 1 && strings.Contains(rel.Kept[0], "10.0.0.3 is leased in network")) {
				t.Errorf("release kept %q", rel.Kept)
			}
			if n := w.sweeper.Releases(w.dir())[ForwardKeptCount]; n != map[bool]int{false: 0, true: 1}[kept] {
				t.Errorf("%s count %d", ForwardKeptCount, n)
			}
		})
	}
}

// filterFailing fails the filter table's deletions: the attachment's files
// stay, so the next sweep finds its firewall rules through them.
type filterFailing struct{ netfilter.Table }

func (f filterFailing) Delete(table, chain string, spec ...string) error {
	if table == "filter" {
		return errors.New("iptables killed")
	}
	return f.Table.Delete(table, chain, spec...)
}

func TestFirewallRulesThatCannotGoKeepTheFiles(t *testing.T) {
	w := newWorld(t)
	w.staleWithFirewall("gone", "10.0.0.3")
	w.env.Netfilter.Tables = []netfilter.Table{filterFailing{w.nat}}
	w.sweeper.Env = w.env
	rep, err := w.sweeper.Sweep(Request{Dir: w.dir()})
	if err == nil || rep.Released != 0 {
		t.Fatalf("sweep: released %d, err %v", rep.Released, err)
	}
	if !w.hasRecord("gone") || !slices.Contains(w.leases(), "10.0.0.3") {
		t.Errorf("files of an attachment whose firewall rules stayed are gone: leases %v", w.leases())
	}
	w.env.Netfilter.Tables = []netfilter.Table{w.nat}
	w.sweeper.Env = w.env
	if rep := w.sweep(Request{}); rep.Released != 1 || len(w.nat.Forwards()) != 0 {
		t.Errorf("next sweep: released %d, firewall %q", rep.Released, w.nat.Forwards())
	}
}

// A re-ADD's release of the stale earlier attachment takes its firewall
// rules too (firewall's ADD makes them again for the new attachment).
func TestBeginAddReleasesTheFirewallRulesOfTheEarlierAttachment(t *testing.T) {
	w := newWorld(t)
	w.container("c1", "10.0.0.2")
	w.nat.AddForward("10.0.0.2")
	w.host.Namespaces["/run/netns/c1"] = sysinfo.NetnsID{Dev: 4, Ino: 5555}
	att, err := w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "c1", IfName: "eth0"}, "/run/netns/c1")
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	if len(w.nat.Forwards()) != 0 || !strings.Contains(w.log.String(), "firewall rules of 10.0.0.2") {
		t.Errorf("firewall rules left %q; log %q", w.nat.Forwards(), w.log)
	}
	if !slices.Equal(att.Previous, []string{"10.0.0.2/24"}) {
		t.Errorf("Previous = %q", att.Previous)
	}
}

// A DEL without prevResult releases the firewall rules of its addresses
// as a sweep does, and counts one another network leases and keeps, as a
// sweep counts it (regression: that DEL kept them uncounted).
func TestDelWithoutPrevResultCountsTheFirewallRulesItKeeps(t *testing.T) {
	w := newWorld(t)
	w.container("c1", "10.0.0.3")
	w.nat.AddForward("10.0.0.3")
	plantLease(t, w.dataDir, "other-net", "10.0.0.3")
	w.attach.NoPrevResult = true
	if err := w.attach.EndDel(w.dir(), records.Key{ContainerID: "c1", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	if got := w.nat.Forwards(); !slices.Equal(got, []string{"10.0.0.3"}) {
		t.Errorf("firewall rules left %q, want those of 10.0.0.3, which other-net leases", got)
	}
	if n := w.sweeper.Releases(w.dir())[ForwardKeptCount]; n != 1 {
		t.Errorf("%s count %d, want 1", ForwardKeptCount, n)
	}
}
