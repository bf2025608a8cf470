package ipamdir

import "github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netdir"

// Dir is the entry's network under its data directory.
func (c *Config) Dir() netdir.Dir { return netdir.New(c.DataDir, c.Name) }

// CheckDirs refuses data, lease and record directories someone else could
// have planted (see netdir.Dir.Check). Run it before touching anything.
func (c *Config) CheckDirs() error { return c.Dir().Check() }
