// Package e2e holds the end-to-end tests of nomad-bridge-cni.
//
// They drive the real plugin binaries (nomad-bridge-cni and the reference
// bridge, host-local, loopback, firewall and portmap) through the real
// cnitool, in real network namespaces, and assert the state the kernel,
// iptables and host-local's lease store end up in. A small libcni harness
// covers what cnitool cannot express (GC with a list of valid attachments).
//
// The tests need root, ip, iptables, ip6tables, mount and ping. Without them
// they skip, saying why; with CI set in the environment a missing
// prerequisite is a failure instead, so CI can never pass by skipping.
//
// Every test works on its own network name, bridge, subnets, namespaces and
// tmpfs, and removes all of it (including the iptables rules keyed by its
// network name) on success and failure alike; what a run killed before its
// cleanup left, the next run reaps (reap_test.go). Run them with
//
//	NBC_BIN_DIR=$PWD/bin go test -count=1 -p 1 -v ./test/e2e/
//
// NBC_BIN_DIR defaults to the repository's bin/ directory.
package e2e
