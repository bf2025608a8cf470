package cli

import (
	"fmt"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/conflists"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/metrics"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/operator"
)

const metricsUsage = `Usage: nomad-bridge-cni metrics [--data-dir D] [--conf-dir DIR]...

Prints the state of every network under the data dir in the Prometheus text
exposition format, for node_exporter's textfile collector: attachments by
state, leases, the size of each network's ranges (from its conflist, found as
doctor finds them), containers with orphan NAT rules, and the seconds since a
CHECK last swept the network. Changes nothing. Write the file atomically, e.g.
from a systemd timer or cron every minute:

  nomad-bridge-cni metrics > /var/lib/node_exporter/textfile/nbc.prom.$$ &&
    mv /var/lib/node_exporter/textfile/nbc.prom.$$ /var/lib/node_exporter/textfile/nbc.prom

Flags:
`

func (c *cli) metrics(args []string) (code int) {
	flags := c.flagSet("metrics", metricsUsage)
	dataDir := flags.String("data-dir", ipamdir.DefaultDataDir, "the plugin's dataDir")
	confDirs := flags.StringArray("conf-dir", nil, "also look for conflists here (repeatable)")
	if code, done := c.parse(flags, args); done {
		return code
	}
	if flags.NArg() > 0 {
		return c.fail(2, fmt.Errorf("metrics takes no arguments, got %q", flags.Args()), "metrics")
	}
	dirs, skipped, err := ipamdir.List(*dataDir, "")
	if err != nil {
		return c.fail(1, err, "")
	}
	defer c.reportSkipped(skipped, &code)
	hostNets := conflists.Networks(conflists.Read(withDefaultConfDirs(*confDirs)))
	nets, err := metrics.Collect(c.sweeper(), operator.NewScope(*dataDir, dirs, hostNets), conflists.RangeAddresses(hostNets))
	if err != nil {
		return c.fail(1, err, "")
	}
	if err := metrics.Write(c.stdout, nets); err != nil {
		return c.fail(1, err, "")
	}
	return 0
}
