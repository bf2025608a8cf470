package cli

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/conflists"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/metrics"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/operator"
)

const metricsUsage = `Usage: nomad-bridge-cni metrics [--data-dir D] [--conf-dir DIR]... [--textfile PATH]

Prints the state of every network under the data dir in the Prometheus text
exposition format, for node_exporter's textfile collector: attachments by
state, leases, the size of each network's ranges (from its conflist, found as
doctor finds them), containers with orphan NAT rules, skipped files, the
seconds since a CHECK last swept the network, whether its data dir is a
tmpfs, and its releases, kept firewall rules and refused ADDs, counted
across runs. Changes nothing. --textfile writes them to PATH
instead of stdout, atomically (a temp file beside it, renamed over it), mode
0644 for node_exporter to read; on a failure PATH is left as it was. The
packaged nomad-bridge-cni-metrics.timer runs it every minute:

  nomad-bridge-cni metrics --textfile /var/lib/prometheus/node-exporter/nomad-bridge-cni.prom

Flags:
`

func (c *cli) metrics(args []string) (code int) {
	flags := c.flagSet("metrics", metricsUsage)
	dataDir := flags.String("data-dir", ipamdir.DefaultDataDir, "the plugin's dataDir")
	confDirs := flags.confDirFlag("also look for conflists here (repeatable)")
	textfile := flags.String("textfile", "", "write to this file, atomically, instead of stdout (node_exporter's textfile collector reads *.prom)")
	if code, done := c.parse(flags, args); done {
		return code
	}
	dirs, skipped, err := ipamdir.List(*dataDir, "")
	if errors.Is(err, fs.ErrNotExist) {
		// A tmpfs data dir is made by the boot's first ADD: until then it
		// holds no network, as for gc --all-data-dirs, and a failure here
		// would age the textfile into "the metrics timer is dead".
		fmt.Fprintf(c.stderr, "nomad-bridge-cni: data dir %s does not exist: no network to report\n", statefile.Printable(*dataDir))
		err = nil
	}
	if err != nil {
		return c.fail(1, err, "")
	}
	defer c.reportSkipped(skipped, &code)
	hostNets := hostNetworks(*confDirs)
	nets, err := metrics.Collect(c.sweeper(), operator.NewScope(*dataDir, dirs, hostNets), conflists.RangeAddresses(hostNets))
	if err != nil {
		return c.fail(1, err, "")
	}
	text := metrics.Text(nets)
	if *textfile == "" {
		if _, err := c.stdout.Write(text); err != nil {
			return c.fail(1, err, "")
		}
		return 0
	}
	if err := statefile.WriteAtomic(*textfile, text, worldReadable); err != nil {
		return c.fail(1, fmt.Errorf("write %s: %w", *textfile, err), "")
	}
	return 0
}

// worldReadable makes WriteAtomic's temp file readable by node_exporter,
// which runs as its own user and owns the directory: what it put in the
// temp file's place meanwhile is not followed (statefile.Open), and its
// own file becoming readable is no harm.
func worldReadable(tmp string) error {
	f, err := statefile.Open(tmp)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Chmod(0o644)
}
