package skel

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/version"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/conflists"
)

// Version is stamped at build time:
//
//	go build -ldflags "-X github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/skel.Version=v1.2.3"
var Version = "v0.1.0"

// SupportedVersions are the CNI spec versions the wrapper speaks. It passes
// the entry through to bridge, which speaks them all; 0.3.0 is the oldest
// whose result carries interfaces, which later plugins in a chain need.
var SupportedVersions = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

// About is the plugin's about line, which Nomad's fingerprint parses (see
// printAbout).
func About() string {
	return fmt.Sprintf("CNI %s plugin %s", conflists.PluginName, Version)
}
