package doctor

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/conflists"
)

// readConflists reads every configuration file of o.ConfDirs as
// conflists.Read does and returns the bridge networks it found, with a
// finding for each file that uses the plugin (valid or not) and for each
// file that cannot be read. The plugin installed as bridge (fr) serves the
// "type": "bridge" entries of a file only where the runtime that reads it
// finds it first: another runtime's directory may be read with the
// reference bridge first in its own plugin dirs.
func readConflists(o Options, fr front) ([]*conflists.Network, []Finding) {
	files := conflists.Read(o.ConfDirs, false)
	if fr.path != "" {
		asPlugin := conflists.Read(o.ConfDirs, true)
		for i, f := range files {
			first, err := invoke.FindInPath("bridge", pluginPathOf(o, f.Path).dirs)
			if i < len(asPlugin) && asPlugin[i].Path == f.Path && err == nil && first == fr.path {
				files[i] = asPlugin[i]
			}
		}
	}
	var fs []Finding
	for _, f := range files {
		switch {
		case f.NotCNI:
			// go-cni's loadFromConfDir and Nomad's loadCNIConf return
			// on the first file they cannot load (CRI-O passes it over).
			fs = append(fs, Finding{Level: Error, Check: "conflist", Subject: f.Path, Message: fmt.Sprintf("not a CNI configuration (%v)", f.Err), Fix: "fix it or remove it: containerd and Nomad stop loading the directory at it"})
		case f.Err != nil:
			fs = append(fs, Finding{Level: Error, Check: "conflist", Subject: f.Path, Message: fmt.Sprintf("cannot read: %v", f.Err), Fix: "remove it, or fix it"})
		}
		for _, n := range f.Networks {
			switch {
			case n.Err != nil:
				fs = append(fs, Finding{Level: Error, Check: "conflist", Subject: f.Path, Message: fmt.Sprintf("entry %d of network %q: %v", n.Entry, n.Name, n.Err), Fix: "fix the entry: every ADD fails the same way"})
			case n.Ours:
				how := pluginName
				if n.Conf.Type != pluginName {
					how = fmt.Sprintf("%s (installed as %q)", pluginName, n.Conf.Type)
				}
				fs = append(fs, Finding{Level: OK, Check: "conflist", Subject: f.Path, Message: fmt.Sprintf("network %q uses %s (dataDir %s, delegate %s)", n.Name, how, n.Conf.DataDir, n.Conf.Delegate)})
			}
		}
	}
	return conflists.Networks(files), fs
}

const pluginName = conflists.PluginName
