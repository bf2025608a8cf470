package doctor

import (
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/hashicorp/go-version"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/conflists"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/metrics"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netconf"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/operator"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/plugin"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
)

// recordedVersion is what Nomad's fingerprint records of a plugin's
// output: its first token that hashicorp/go-version's NewSemver accepts,
// as Nomad reads it ("" for none).
func recordedVersion(out string) string {
	toks := strings.Fields(out)
	if i := slices.IndexFunc(toks, func(tok string) bool { _, err := version.NewSemver(tok); return err == nil }); i >= 0 {
		return toks[i]
	}
	return ""
}

// front is the plugin installed as "bridge" first in the CNI path (path),
// and the reference bridge it delegates to (real: the first "bridge" past
// it that is not the plugin).
type front struct{ path, real string }

// isPlugin: what the binary printed with no arguments has the plugin's
// version line. Installed as bridge, the plugin prints the reference
// bridge's lines first (what Nomad's fingerprint reads), then its own.
func isPlugin(out string) bool {
	line := "CNI " + pluginName + " plugin"
	return strings.HasPrefix(out, line) || strings.Contains(out, "\n"+line)
}

// findFront tells whether the first "bridge" in the CNI path is the
// plugin, and which reference bridge it then calls.
func findFront(o Options) (front, []Finding) {
	first, err := invoke.FindInPath("bridge", o.CNIPath)
	if err != nil {
		return front{}, nil
	}
	if out, _ := o.Version(first); !isPlugin(out) {
		return front{}, nil
	}
	f := front{path: first}
	for _, dir := range o.CNIPath {
		cand := filepath.Join(dir, "bridge")
		if fi, err := os.Stat(cand); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 || cand == first {
			continue
		}
		if out, _ := o.Version(cand); !isPlugin(out) {
			f.real = cand
			break
		}
	}
	if f.real == "" {
		return f, []Finding{{Level: Error, Check: "plugin", Subject: first, Message: fmt.Sprintf("%s installed as bridge, with no reference bridge after it in %s: every ADD through it fails", pluginName, strings.Join(o.CNIPath, ":")),
			Fix: fmt.Sprintf("install the reference CNI plugins (the cni-plugins release of github.com/containernetworking/plugins, or make plugins) into a directory after %s in the runtime's CNI path", filepath.Dir(first))}}
	}
	return f, []Finding{{Level: OK, Check: "plugin", Subject: first, Message: fmt.Sprintf("%s installed as bridge: the conflists' \"type\": \"bridge\" entries with host-local are its; it delegates to %s", pluginName, f.real)}}
}

// referencePlugins are the plugins of github.com/containernetworking/plugins.
var referencePlugins = []string{"bandwidth", "bridge", "dhcp", "dummy", "firewall", "host-device", "host-local", "ipvlan", "loopback", "macvlan", "portmap", "ptp", "sbr", "static", "tap", "tuning", "vlan", "vrf"}

// installFix says what to install where for a plugin not found.
func installFix(name, where string) string {
	switch {
	case name == pluginName:
		return fmt.Sprintf("install %s into one of %s (the .deb or .rpm, the release tarball, or make install)", pluginName, where)
	case slices.Contains(referencePlugins, name):
		return fmt.Sprintf("install the reference CNI plugins (the cni-plugins release of github.com/containernetworking/plugins, or make plugins, stamped) into one of %s", where)
	}
	return fmt.Sprintf("install the %q CNI plugin into one of %s", name, where)
}

// pluginPath is where the runtime that reads a conflist looks for
// plugins: dirs, who says whose they are ("" for the CNI path given to the
// doctor), and whether the doctor can tell (else a plugin found nowhere is
// worth a look, not broken: the runtime may look elsewhere).
type pluginPath struct {
	dirs  []string
	who   string
	known bool
}

// pluginPathOf is the plugin path a conflist's file is judged by: the
// one given to the doctor; Nomad's cni_path for its cni_config_dir; the
// default plugin dirs of the runtimes that read its directory; else, the
// reader unknown, the doctor's CNI path and every runtime's default dirs.
func pluginPathOf(o Options, file string) pluginPath {
	dir := filepath.Clean(filepath.Dir(file))
	switch {
	case o.CNIPathGiven:
		return pluginPath{o.CNIPath, "", true}
	case o.Nomad && dir == filepath.Clean(o.nomad.CNIConfigDir):
		return pluginPath{o.nomad.CNIPath, "Nomad's cni_path ", true}
	}
	readers := o.Readers
	if readers == nil {
		readers = conflists.DefaultReaders
	}
	if r, ok := readers[dir]; ok {
		return pluginPath{r.PluginDirs, "the default plugin dirs of " + r.Runtimes + ", ", true}
	}
	dirs := slices.Clone(o.CNIPath)
	for _, conf := range slices.Sorted(maps.Keys(readers)) {
		for _, d := range readers[conf].PluginDirs {
			if !slices.Contains(dirs, d) {
				dirs = append(dirs, d)
			}
		}
	}
	return pluginPath{dirs, "", false}
}

// checkPlugins finds every plugin the plugin's chains need in the plugin
// path of the runtime that reads each chain's conflist, and reads its
// version as Nomad does.
func checkPlugins(o Options, ours []*conflists.Network, fr front) []Finding {
	type group struct {
		path pluginPath
		// need are the plugins, in order; files, the files that need each.
		need  []string
		files map[string][]string
	}
	var groups []*group
	for _, n := range ours {
		pp := pluginPathOf(o, n.File)
		i := slices.IndexFunc(groups, func(g *group) bool { return slices.Equal(g.path.dirs, pp.dirs) && g.path.who == pp.who })
		if i < 0 {
			i = len(groups)
			groups = append(groups, &group{path: pp, files: map[string][]string{}})
		}
		g := groups[i]
		for _, t := range append(slices.Clone(n.Plugins), n.Conf.Delegate, netconf.HostLocal) {
			if t == "" || t == "flannel" {
				continue
			}
			if !slices.Contains(g.need, t) {
				g.need = append(g.need, t)
			}
			if !slices.Contains(g.files[t], n.File) {
				g.files[t] = append(g.files[t], n.File)
			}
		}
	}
	var fs []Finding
	// seen are the plugins already reported.
	seen := map[string]bool{}
	for _, g := range groups {
		where := strings.Join(g.path.dirs, ":")
		// The front copy's reference bridge counts where the path starts
		// with the doctor's, in which that copy was found.
		behindFront := fr.path != "" && len(g.path.dirs) >= len(o.CNIPath) && slices.Equal(g.path.dirs[:len(o.CNIPath)], o.CNIPath)
		for _, name := range g.need {
			find := plugin.FindDelegate // past the plugin itself, as it delegates
			if name == pluginName {
				find = invoke.FindInPath
			}
			if name == "bridge" && behindFront {
				if fr.real == "" {
					continue // findFront said so
				}
				find = func(string, []string) (string, error) { return fr.real, nil }
			}
			path, err := find(name, g.path.dirs)
			neededBy := strings.Join(g.files[name], ", ")
			switch {
			case err != nil && g.path.who == "" && g.path.known:
				fs = append(fs, Finding{Level: Error, Check: "plugin", Subject: name, Message: fmt.Sprintf("not found in %s: %v", where, err), Fix: installFix(name, where)})
			case err != nil && g.path.known:
				fs = append(fs, Finding{Level: Error, Check: "plugin", Subject: name, Message: fmt.Sprintf("not found in %s%s (for %s): %v", g.path.who, where, neededBy, err), Fix: installFix(name, where)})
			case err != nil:
				fs = append(fs, Finding{Level: Warn, Check: "plugin", Subject: name, Message: fmt.Sprintf("not found in %s (for %s): %v; the doctor cannot tell which runtime reads %s, so not where it looks for plugins", where, neededBy, err, neededBy),
					Fix: fmt.Sprintf("install %s where the runtime that reads %s looks for plugins, or tell the doctor where that is: nomad-bridge-cni doctor --cni-path DIRS", name, neededBy)})
			}
			if err != nil || seen[path] {
				continue
			}
			seen[path] = true
			out, err := o.Version(path)
			tok := recordedVersion(out)
			switch {
			case err != nil:
				fs = append(fs, Finding{Level: Warn, Check: "plugin", Subject: path, Message: fmt.Sprintf("does not run with no arguments: %v", err), Fix: "reinstall it"})
			case strings.Contains(out, "version unknown"):
				fs = append(fs, Finding{Level: Warn, Check: "plugin", Subject: path, Message: "version unknown: built without its version stamped", Fix: "install plugins stamped with their version: make plugins"})
			case tok == "":
				fs = append(fs, Finding{Level: Warn, Check: "plugin", Subject: path, Message: "prints no version", Fix: "install plugins stamped with their version: make plugins"})
			default:
				fs = append(fs, Finding{Level: OK, Check: "plugin", Subject: path, Message: "version " + tok})
			}
		}
	}
	return fs
}

// checkDataDirs: each dataDir exists, is safe, lives in memory, has room.
func checkDataDirs(o Options, ours []*conflists.Network) []Finding {
	var fs []Finding
	seen := map[string]bool{}
	for _, n := range ours {
		d := n.Conf.DataDir
		// Check compares owners with this process's user: only root's
		// answer is the plugin's.
		if err := ipamdir.New(d, n.Name).Check(); err != nil && o.EUID == 0 {
			fs = append(fs, Finding{Level: Error, Check: "dataDir", Subject: d, Message: fmt.Sprintf("unsafe for network %q: %v", n.Name, err), Fix: "remove what was planted, or chown it to root: every verb refuses it"})
		}
		if seen[d] {
			continue
		}
		seen[d] = true
		if _, err := os.Stat(d); err != nil {
			fs = append(fs, Finding{Level: Warn, Check: "dataDir", Subject: d, Message: "does not exist yet (the first ADD creates it)"})
			continue
		}
		switch mem, err := o.OnTmpfs(d); {
		case err != nil:
			fs = append(fs, Finding{Level: Warn, Check: "dataDir", Subject: d, Message: fmt.Sprintf("cannot tell whether it is a tmpfs: %v", err)})
		case !mem:
			fs = append(fs, Finding{Level: Warn, Check: "dataDir", Subject: d, Message: "not a tmpfs: leases survive a reboot (the boot rule still reclaims them, later)", Fix: "mount a tmpfs there, or point \"dataDir\" at one (/run/cni)"})
		default:
			fs = append(fs, Finding{Level: OK, Check: "dataDir", Subject: d, Message: "a tmpfs: leases die with the boot"})
		}
		// Room that cannot be told is not judged.
		r, err := o.Free(d)
		if err != nil {
			continue
		}
		free := fmt.Sprintf("%d bytes and %d inodes free", r.Bytes, r.Inodes)
		if r.Inodes == math.MaxUint64 {
			free = fmt.Sprintf("%d bytes free", r.Bytes)
		}
		switch {
		case r.Bytes < addBytes || r.Inodes < addInodes:
			fs = append(fs, Finding{Level: Error, Check: "dataDir", Subject: d, Message: free + ": an ADD cannot write its record and lease", Fix: "make room on that filesystem"})
		case r.Bytes < marginBytes || r.Inodes < marginInodes:
			fs = append(fs, Finding{Level: Warn, Check: "dataDir", Subject: d, Message: "nearly full: " + free, Fix: "make room on that filesystem before ADDs fail"})
		}
	}
	return fs
}

// An ADD writes a record and a lease, the record through a temporary
// file, and host-local its last reserved address (plus markers on a
// network's first ADD): a few files of a few hundred bytes, each a 4 KiB
// page on a tmpfs. Below addBytes or addInodes (room for about two ADDs)
// the next one can fail; below the margin (a few dozen) it is worth a
// look, no more: ADDs still work.
const (
	addBytes, addInodes       = 64 << 10, 16
	marginBytes, marginInodes = 1 << 20, 256
)

// checkClashes: two networks with one name or one bridge, or overlapping
// subnets kept in different lease directories (two host-local stores
// handing out one range: duplicate addresses), Nomad's built-in network
// among them with Nomad (its leases where front puts them: nomadBuiltin).
func checkClashes(o Options, nets []*conflists.Network, front bool) []Finding {
	all := slices.Clone(nets)
	if o.Nomad {
		all = append(all, nomadBuiltin(o.nomad, front))
	}
	var fs []Finding
	for i, a := range all {
		for _, b := range all[i+1:] {
			if a.File == b.File && a.Name == b.Name {
				continue
			}
			pair := fmt.Sprintf("%q (%s) and %q (%s)", a.Name, a.File, b.Name, b.File)
			switch {
			case a.Name == b.Name:
				fs = append(fs, Finding{Level: Error, Check: "clash", Subject: a.Name, Message: "two networks named " + pair, Fix: "rename one: runtimes pick one of them, and they share a lease directory"})
			case a.Bridge == b.Bridge:
				fs = append(fs, Finding{Level: Error, Check: "clash", Subject: a.Bridge, Message: "one bridge for " + pair, Fix: "give each network its own \"bridge\""})
			}
			if a.Dir.Leases() == b.Dir.Leases() {
				continue
			}
			for _, p := range a.Subnets {
				for _, q := range b.Subnets {
					if p.Overlaps(q) {
						fs = append(fs, Finding{Level: Error, Check: "clash", Subject: p.String(), Message: fmt.Sprintf("%s overlaps %s of %s, kept in %s and %s: one address can be handed out twice", p, q, pair, a.Dir.Leases(), b.Dir.Leases()), Fix: "give one of them another subnet"})
					}
				}
			}
		}
	}
	return fs
}

// checkState summarizes, per network of the plugin, what `leases` judges:
// legacy leases still waiting for the migration, and attachments that are
// stale, detached or unknown, NAT rules nobody holds, and files skipped.
// Nomad's built-in bridge network is the plugin's too when it is installed
// as bridge in cni_path (front).
func checkState(o Options, ours, nets []*conflists.Network, front bool) []Finding {
	var fs []Finding
	done := map[string]bool{}
	for _, n := range ours {
		if done[n.Dir.Leases()] {
			continue
		}
		done[n.Dir.Leases()] = true
		fs = append(fs, legacyFindings(o, n)...)
		if _, err := os.Stat(n.Conf.DataDir); err == nil {
			fs = append(fs, stateFindings(o, n, nets, n.Name)...)
		}
	}
	if n := nomadBuiltin(o.nomad, true); o.Nomad && front && !slices.ContainsFunc(nets, func(c *conflists.Network) bool { return c.Dir.Leases() == n.Dir.Leases() }) {
		fs = append(fs, stateFindings(o, n, nets, n.Name+" (Nomad's built-in bridge network)")...)
	}
	return fs
}

// legacyFindings says, for a root doctor, how many legacy leases of
// network n wait for the migration, counted as the migration takes them
// (reclaim.LegacyLeases), or why the migration refuses its legacy
// directory: every ADD then fails on it. A network migrated this boot
// (reclaim's marker) has none waiting: what stays there is its migrated
// attachments', left for their runtime's DEL, and no run of this boot
// looks again.
func legacyFindings(o Options, n *conflists.Network) []Finding {
	if o.EUID != 0 || filepath.Clean(n.Conf.LegacyDataDir) == filepath.Clean(n.Conf.DataDir) || o.Sweeper != nil && o.Sweeper.MigratedThisBoot(n.Dir) {
		return nil
	}
	legacy := ipamdir.New(n.Conf.LegacyDataDir, n.Conf.Name)
	switch k, err := reclaim.LegacyLeases(legacy); {
	case err != nil:
		return []Finding{{Level: Error, Check: "state", Subject: n.Name, Message: fmt.Sprintf("the migration of its legacy leases fails: %v: every ADD of the network fails on it", err),
			Fix: fmt.Sprintf("remove %s, or make it a real directory (host-local's own, of the network's leases): the migration opens nothing else", shellQuote(legacy.Leases()))}}
	case k > 0:
		return []Finding{{Level: Warn, Check: "state", Subject: n.Name, Message: fmt.Sprintf("%d legacy lease(s) in %s wait for the migration", k, legacy.Leases()), Fix: "the network's next ADD or CHECK migrates them"}}
	}
	return nil
}

// stateFindings says what the attachments of network n are, and how many
// files the sweep skipped, for a root doctor with a sweeper; subject names n.
func stateFindings(o Options, n *conflists.Network, nets []*conflists.Network, subject string) []Finding {
	if o.Sweeper == nil || o.EUID != 0 {
		return nil
	}
	st, err := networkState(o.Sweeper, operator.NewScope(n.Dir.DataDir, []ipamdir.Dir{n.Dir}, nets))
	if err != nil {
		return []Finding{{Level: Warn, Check: "state", Subject: subject, Message: fmt.Sprintf("cannot read: %v", err)}}
	}
	count := st.Attachments
	msg := fmt.Sprintf("%d live, %d pending, %d stale, %d detached, %d unknown, %d orphan NAT rule set(s)", count[reclaim.Live], count[reclaim.Pending], count[reclaim.Stale], count[reclaim.Detached], count[reclaim.Unknown], st.OrphanRules)
	f := Finding{Level: Warn, Check: "state", Subject: subject, Message: msg}
	switch {
	case !n.Dir.Served() && st.OrphanRules > 0:
		// Every gc refuses a network with no directory in its data dir.
		f.Fix = fmt.Sprintf("no gc sweeps %s in %s before an ADD through the plugin makes its directory there: the first one marks the network the plugin's, and the next CHECK or gc releases them", n.Name, n.Dir.DataDir)
	case count[reclaim.Stale] > 0 || st.OrphanRules > 0:
		f.Fix = fmt.Sprintf("nomad-bridge-cni gc --data-dir %s --network %s --orphan-rules (see nomad-bridge-cni leases --data-dir %s)", shellQuote(n.Dir.DataDir), shellQuote(n.Name), shellQuote(n.Dir.DataDir))
	case count[reclaim.Detached] > 0:
		f.Fix = "see nomad-bridge-cni leases: a detached attachment's container still runs in its old namespace"
	case count[reclaim.Unknown] > 0:
		f.Fix = "see nomad-bridge-cni leases: an unknown attachment's lease has no record of the plugin (another writer, or a judgement it could not make) and is never released by a sweep: DEL it through its runtime, or remove the lease once nothing uses its address"
	default:
		f.Level = OK
	}
	fs := []Finding{f}
	if st.Skipped > 0 {
		fs = append(fs, Finding{Level: Warn, Check: "state", Subject: subject, Message: fmt.Sprintf("%d damaged or foreign file(s) skipped: neither judged nor counted", st.Skipped), Fix: fmt.Sprintf("see nomad-bridge-cni leases --data-dir %s --network %s: it lists them, each with why", shellQuote(n.Dir.DataDir), shellQuote(n.Name))})
	}
	return fs
}

// networkState is what `metrics` reads of the one network of scope: its
// attachments by state (each once, however many leases it holds), its
// orphan NAT rule sets and the files its sweep skipped. The sweep is a dry
// run, which creates nothing (not even host-local's lock of a network
// never served), and it calls no rule set an orphan whose container holds
// a lease or record elsewhere (the legacy dir waiting for the migration).
func networkState(s *reclaim.Sweeper, scope operator.Scope) (metrics.Network, error) {
	nets, err := metrics.Collect(s, scope, nil)
	if err != nil {
		return metrics.Network{}, err
	}
	return nets[0], nil
}

// shellQuote quotes s for a POSIX shell when it needs it, so that a fix can
// be pasted as it is printed.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+=:,@") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
