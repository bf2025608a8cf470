package netfilter_test

import (
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/containernetworking/plugins/pkg/utils"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/fakenat"
)

// askedRelease lists "nomad"'s iptables rules in f as a sweep does and
// releases owners, with running answering Cleaner.Running; it returns the
// container IDs of each question.
func askedRelease(t *testing.T, f *fakenat.Table, running func(call int, ids []string) (map[string]int, error), owners ...string) (map[string][]string, map[string]error, [][]string) {
	t.Helper()
	var asked [][]string
	c := &netfilter.Cleaner{Tables: []netfilter.Table{f}, Running: func(ids []string) (map[string]int, error) {
		asked = append(asked, slices.Clone(ids))
		return running(len(asked), ids)
	}}
	rules, err := c.Backends()[0].List("nomad")
	if err != nil {
		t.Fatal(err)
	}
	removed, failed := rules.Release(owners)
	return removed, failed, asked
}

var (
	deadMasq = utils.FormatChainName("nomad", "dead")
	deadDN   = utils.MustFormatChainNameWithPrefix("nomad", "dead", "DN-")
)

// TestSweepReleaseLeavesAContainerToItsRunningCommand: a CNI command of the
// container runs when the sweep first asks: none of its rules is touched
// (portmap's teardown may be anywhere in it), and it fails with a
// BusyError naming the process; the others are released. Only containers
// with a portmap chain are asked about.
func TestSweepReleaseLeavesAContainerToItsRunningCommand(t *testing.T) {
	f := fakenat.New()
	f.AddContainer("nomad", "dead", "10.0.0.2", 8080)
	f.AddContainer("nomad", "gone", "10.0.0.3", 8081)
	f.AddContainer("nomad", "nomap", "10.0.0.4", 0)
	before := slices.Clone(f.Chains[deadDN])
	removed, failed, asked := askedRelease(t, f, func(int, []string) (map[string]int, error) {
		return map[string]int{"dead": 4242}, nil
	}, "dead", "gone", "nomap")

	var busy *netfilter.BusyError
	if !errors.As(failed["dead"], &busy) || busy.PID != 4242 || busy.Emptied {
		t.Fatalf("dead: failed %v, want a BusyError of pid 4242, not emptied", failed["dead"])
	}
	if len(removed["dead"]) != 0 || !f.Owns("nomad", "dead") || !reflect.DeepEqual(f.Chains[deadDN], before) || len(f.Chains[deadMasq]) != 2 {
		t.Errorf("dead's rules were touched: removed %v, chains %v", removed["dead"], f.Chains)
	}
	if failed["gone"] != nil || failed["nomap"] != nil || f.Owns("nomad", "gone") || f.Owns("nomad", "nomap") {
		t.Errorf("the others were not released: failed %v", failed)
	}
	if want := [][]string{{"dead", "gone"}, {"gone"}}; !reflect.DeepEqual(asked, want) {
		t.Errorf("asked %v, want %v (those with a portmap chain, then those emptied)", asked, want)
	}
}

// TestSweepReleaseEmptiesAChainWhoseCommandBeganMeanwhile: the command
// began after the first question. The jump to portmap's chain goes and the
// chain is emptied (neither fails portmap's teardown), but it is not
// deleted (BusyError, Emptied); bridge's jump and chain, which go after
// it, stay with it.
func TestSweepReleaseEmptiesAChainWhoseCommandBeganMeanwhile(t *testing.T) {
	f := fakenat.New()
	f.AddContainer("nomad", "dead", "10.0.0.2", 8080)
	removed, failed, _ := askedRelease(t, f, func(call int, _ []string) (map[string]int, error) {
		if call == 1 {
			return nil, nil
		}
		return map[string]int{"dead": 7}, nil
	}, "dead")
	var busy *netfilter.BusyError
	if !errors.As(failed["dead"], &busy) || !busy.Emptied || busy.PID != 7 {
		t.Fatalf("failed %v, want an emptied BusyError of pid 7", failed["dead"])
	}
	rules, ok := f.Chains[deadDN]
	if !ok || len(rules) != 0 {
		t.Errorf("portmap's chain: exists %v, rules %q; want it there and empty", ok, rules)
	}
	if !f.Has(deadMasq) || len(f.Chains["POSTROUTING"]) != 1 || len(f.Chains["CNI-HOSTPORT-DNAT"]) != 0 {
		t.Errorf("want portmap's jump gone, bridge's jump and chain there: %v", f.Chains)
	}
	if want := []string{"jump in CNI-HOSTPORT-DNAT"}; !reflect.DeepEqual(removed["dead"], want) {
		t.Errorf("removed %v, want %v", removed["dead"], want)
	}
}

// TestSweepReleaseDeletesTheChainOnlyAfterEmptyingIt: nothing runs for the
// container: everything goes, the portmap chain after its jump and after
// it was emptied, the second question between the two, and bridge's jump
// and chain last.
func TestSweepReleaseDeletesTheChainOnlyAfterEmptyingIt(t *testing.T) {
	f := fakenat.New()
	f.AddContainer("nomad", "dead", "10.0.0.2", 8080)
	var callsAtSecond []string
	removed, failed, asked := askedRelease(t, f, func(call int, _ []string) (map[string]int, error) {
		if call == 2 {
			callsAtSecond = slices.Clone(f.Calls)
		}
		return nil, nil
	}, "dead")
	if failed["dead"] != nil || f.Owns("nomad", "dead") || len(asked) != 2 {
		t.Fatalf("failed %v, owns %v, asked %v", failed, f.Owns("nomad", "dead"), asked)
	}
	if len(removed["dead"]) != 4 {
		t.Errorf("removed %v", removed["dead"])
	}
	if want := "flush " + deadDN; len(callsAtSecond) == 0 || callsAtSecond[len(callsAtSecond)-1] != want || slices.Contains(callsAtSecond, "delete chain "+deadDN) {
		t.Errorf("calls before the second question %q, want them to end with %q and not delete the chain", callsAtSecond, want)
	}
	if i, j := slices.Index(f.Calls, "delete chain "+deadDN), slices.Index(f.Calls, "delete POSTROUTING"); i < 0 || j < i || f.Calls[len(f.Calls)-1] != "clear+delete "+deadMasq {
		t.Errorf("calls %q: want portmap's chain deleted, then bridge's jump, then its chain", f.Calls)
	}
}

// TestSweepReleaseWhenProcessesCannotBeRead: a question that fails proves
// nothing: every container it asked about is left (BusyError with Err).
func TestSweepReleaseWhenProcessesCannotBeRead(t *testing.T) {
	f := fakenat.New()
	f.AddContainer("nomad", "dead", "10.0.0.2", 8080)
	_, failed, _ := askedRelease(t, f, func(int, []string) (map[string]int, error) {
		return nil, errors.New("boom")
	}, "dead")
	var busy *netfilter.BusyError
	if !errors.As(failed["dead"], &busy) || busy.Err == nil || !f.Owns("nomad", "dead") || len(f.Chains[deadDN]) == 0 {
		t.Fatalf("failed %v; rules touched: %v", failed["dead"], f.Chains)
	}
}

// TestDELReleaseAsksNobody: a DEL's and a re-ADD's release are the
// container's CNI command themselves: they never ask, and release it all.
func TestDELReleaseAsksNobody(t *testing.T) {
	f := fakenat.New()
	f.AddContainer("nomad", "dead", "10.0.0.2", 8080)
	c := &netfilter.Cleaner{Tables: []netfilter.Table{f}, Running: func([]string) (map[string]int, error) {
		t.Fatal("a DEL asked whether a CNI command of its container runs")
		return nil, nil
	}}
	removed, err := c.ReleaseAttachment("nomad", "eth0", "dead", true)
	if err != nil || len(removed) != 4 || f.Owns("nomad", "dead") {
		t.Fatalf("removed %v, %v; owns %v", removed, err, f.Owns("nomad", "dead"))
	}
}
