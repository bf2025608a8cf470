package cli

import (
	"cmp"
	"os"
	"path/filepath"
	"slices"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/conflists"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/doctor"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/operator"
)

const doctorUsage = `Usage: nomad-bridge-cni doctor [--json] [--conf-dir DIR]... [--cni-path DIRS]

Checks this host, reading only: the conflists that use the plugin (in
/etc/cni/net.d, /opt/cni/config, Apptainer's and k3s's directories, and each
--conf-dir), each entry validated as ADD would; every plugin their chains need
where the runtime that reads each conflist looks (--cni-path for all when
given; else Nomad's cni_path for its cni_config_dir, the default plugin dirs
of containerd, CRI-O and podman for /etc/cni/net.d), with the version Nomad
would read; each dataDir (exists,
safe, tmpfs, free space); networks that clash (one name, one bridge, or
overlapping subnets in different lease directories, Nomad's built-in bridge
network included when Nomad is installed); legacy leases waiting, and stale,
detached or unknown attachments and orphan NAT rules per network.
One line per finding: ✓ fine, ! worth a look, ✗ broken, with the fix.
Exit status 0 when nothing is broken, 1 otherwise, 2 on bad usage.

Flags:
`

func (c *cli) doctor(args []string) int {
	flags := c.flagSet("doctor", doctorUsage)
	jsonOut := flags.Bool("json", false, "print JSON instead of text")
	confDirs := flags.confDirFlag("also look for conflists here (repeatable)")
	cniPath := flags.String("cni-path", cmp.Or(os.Getenv("CNI_PATH"), "/opt/cni/bin"), "the CNI bin dirs, colon-separated, in the runtime's order: every conflist is judged by them")
	if code, done := c.parse(flags, args); done {
		return code
	}
	o := doctor.HostOptions()
	o.ConfDirs = append(slices.Clone(conflists.DefaultDirs), *confDirs...)
	o.CNIPath = filepath.SplitList(*cniPath)
	o.CNIPathGiven = flags.Changed("cni-path") || os.Getenv("CNI_PATH") != ""
	o.Sweeper = c.sweeper()
	r := doctor.Run(o)
	var err error
	if *jsonOut {
		err = operator.WriteJSON(c.stdout, r)
	} else {
		err = doctor.WriteText(c.stdout, r)
	}
	if err != nil {
		return c.fail(1, err, "")
	}
	if !r.OK {
		return 1
	}
	return 0
}
