package netfilter

import (
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/coreos/go-iptables/iptables"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// A release counts a chain as gone when ClearAndDeleteChain succeeds or
// says ErrNoChain, and FlushChain's ErrNoChain as a chain already gone: so
// a chain another rule still jumps to must be an error, and stay listed
// (or its record and lease would go with the chain left for no one to
// find), and a chain that is not there must be ErrNoChain, whatever
// iptables variant says so. Real iptables-legacy and iptables-nft, each in
// a network namespace of the test's own.
func TestChainDeletionSaysWhetherTheChainIsGone(t *testing.T) {
	for _, variant := range []string{"iptables-legacy", "iptables-nft"} {
		t.Run(variant, func(t *testing.T) {
			path, err := exec.LookPath(variant)
			if err != nil {
				testhost.SkipOrFail(t, "needs "+variant)
			}
			if _, err := exec.LookPath(variant + "-restore"); err != nil {
				testhost.SkipOrFail(t, "needs "+variant+"-restore")
			}
			tab := &natTable{path: path, proto: iptables.ProtocolIPv4}
			err = nftNamespace(t).Do(func(ns.NetNS) error {
				for _, args := range [][]string{{"-N", "CNI-free"}, {"-A", "CNI-free", "-j", "MASQUERADE"}, {"-N", "CNI-busy"}, {"-A", "POSTROUTING", "-j", "CNI-busy"}} {
					if out, err := exec.Command(path, append([]string{"-t", "nat"}, args...)...).CombinedOutput(); err != nil {
						return fmt.Errorf("%s %v: %v: %s", variant, args, err, out)
					}
				}
				if err := tab.ClearAndDeleteChain(natTableName, "CNI-free"); err != nil {
					t.Errorf("delete of a chain nothing jumps to: %v", err)
				}
				if err := tab.ClearAndDeleteChain(natTableName, "CNI-busy"); err == nil || errors.Is(err, ErrNoChain) {
					t.Errorf("delete of a chain POSTROUTING jumps to = %v, want a failure that is not ErrNoChain", err)
				}
				if err := tab.ClearAndDeleteChain(natTableName, "CNI-gone"); !errors.Is(err, ErrNoChain) {
					t.Errorf("delete of a chain that is not there = %v, want ErrNoChain", err)
				}
				if err := tab.FlushChain(natTableName, "CNI-DN-gone"); !errors.Is(err, ErrNoChain) {
					t.Errorf("flush of a chain that is not there = %v, want ErrNoChain", err)
				}
				lines, err := tab.List(natTableName)
				if err != nil {
					return err
				}
				if slices.Contains(lines, "-N CNI-free") || !slices.Contains(lines, "-N CNI-busy") {
					t.Errorf("after the deletes, want CNI-free gone and CNI-busy listed:\n%v", lines)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
