// Command nomad-bridge-cni is a CNI plugin that delegates to bridge with
// host-local's leases kept on tmpfs. See pkg/skel for the entry point.
package main

import (
	"os"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/skel"
)

func main() {
	os.Exit(skel.Main(os.Args[1:]))
}
