package skel

import (
	"fmt"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/conflists"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netconf"
)

// Version is stamped at build time:
//
//	go build -ldflags "-X github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/skel.Version=v1.2.3"
var Version = "v0.1.0"

// SupportedVersions are the CNI spec versions the wrapper speaks.
var SupportedVersions = netconf.SupportedVersions

// About is the plugin's about line, which Nomad's fingerprint parses (see
// printAbout).
func About() string {
	return fmt.Sprintf("CNI %s plugin %s", conflists.PluginName, Version)
}
