package netconf

import "github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"

// Dir is the entry's network under its data directory.
func (c *Config) Dir() ipamdir.Dir { return ipamdir.New(c.DataDir, c.Name) }

// CheckDirs refuses data, lease and record directories someone else could
// have planted (see ipamdir.Dir.Check). Run it before touching anything.
func (c *Config) CheckDirs() error { return c.Dir().Check() }

// LegacyDir is the entry's network in host-local's own data dir, where its
// leases were kept before the rewrite.
func (c *Config) LegacyDir() ipamdir.Dir { return ipamdir.New(c.LegacyDataDir, c.Name) }
