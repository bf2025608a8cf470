package release

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// shippedFile is one file of the release as installed: its source in the
// repository ("" for what the release builds: the binary, the licenses of
// what it links, the Debian copyright), its mode, and for the .rpm its
// flags (d: %doc, l: %license, cn: %config(noreplace)).
type shippedFile struct {
	src   string
	mode  fs.FileMode
	flags string
}

// shipped lists what each artifact installs ("tgz", "deb" or "rpm"), by
// absolute path: one list, so that the tarball, the packages and their
// installs are all checked against it.
func shipped(t *testing.T, root, kind string) map[string]shippedFile {
	t.Helper()
	doc, lic := "/usr/share/doc/"+name, "/usr/share/licenses/"+name
	docFlag, licDir := "", doc
	if kind == "rpm" {
		docFlag, licDir = "d", lic
	}
	out := map[string]shippedFile{
		"/opt/cni/bin/" + name:           {mode: 0o755},
		doc + "/README.md":               {src: "README.md", mode: 0o644, flags: docFlag},
		doc + "/SECURITY.md":             {src: "SECURITY.md", mode: 0o644, flags: docFlag},
		licDir + "/THIRD_PARTY_LICENSES": {mode: 0o644, flags: map[bool]string{true: "l"}[kind == "rpm"]},
	}
	if _, err := os.Stat(filepath.Join(root, "LICENSE")); err == nil {
		switch kind {
		case "tgz":
			out[doc+"/LICENSE"] = shippedFile{src: "LICENSE", mode: 0o644}
		case "rpm":
			out[lic+"/LICENSE"] = shippedFile{src: "LICENSE", mode: 0o644, flags: "l"}
		}
	}
	each := func(dir, glob string, fn func(rel string)) {
		matches, err := filepath.Glob(filepath.Join(root, dir, glob))
		if err != nil || len(matches) == 0 {
			t.Fatalf("nothing matches %s/%s (%v)", dir, glob, err)
		}
		for _, m := range matches {
			fn(filepath.Base(m))
		}
	}
	each("docs", "*.md", func(f string) { out[doc+"/docs/"+f] = shippedFile{src: "docs/" + f, mode: 0o644, flags: docFlag} })
	for _, glob := range []string{"*.conflist", "*.json"} {
		each("conflist", glob, func(f string) {
			out[doc+"/examples/"+f] = shippedFile{src: "conflist/" + f, mode: 0o644, flags: docFlag}
		})
	}
	for _, glob := range []string{"*.service", "*.timer"} {
		each("packaging/systemd", glob, func(f string) {
			out["/usr/lib/systemd/system/"+f] = shippedFile{src: "packaging/systemd/" + f, mode: 0o644}
		})
	}
	out["/usr/share/"+name+"/prometheus/"+name+".rules.yml"] = shippedFile{src: "packaging/prometheus/" + name + ".rules.yml", mode: 0o644}
	options := shippedFile{src: "packaging/nomad-bridge-cni.default", mode: 0o644}
	switch kind {
	case "tgz":
		// An example to copy: extracting must not replace the host's.
		out[doc+"/nomad-bridge-cni.default"] = options
	case "deb":
		out["/etc/default/"+name] = options
		out[doc+"/copyright"] = shippedFile{mode: 0o644}
	case "rpm":
		options.flags = "cn"
		out["/etc/sysconfig/"+name] = options
		out["/usr/lib/systemd/system-preset/80-"+name+".preset"] = shippedFile{src: "packaging/nomad-bridge-cni.preset", mode: 0o644}
	}
	return out
}

// parentsOf lists every directory above the files, "/" excluded, sorted.
func parentsOf(files map[string]shippedFile) []string {
	var dirs []string
	for p := range files {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if !slices.Contains(dirs, d) {
				dirs = append(dirs, d)
			}
		}
	}
	slices.Sort(dirs)
	return dirs
}

// tarWants is what a tar of the files holds, named as prefix names its
// entries ("./" for GNU tar's and nfpm's): the files, and every parent
// directory as "<dir>/".
func tarWants(t *testing.T, root string, files map[string]shippedFile, prefix string) map[string]want {
	t.Helper()
	wants := map[string]want{}
	for p, f := range files {
		w := want{mode: f.mode}
		if f.src != "" {
			w.data = readRepo(t, root, f.src)
		}
		wants[prefix+strings.TrimPrefix(p, "/")] = w
	}
	for _, d := range parentsOf(files) {
		wants[prefix+strings.TrimPrefix(d, "/")+"/"] = want{mode: 0o755, dir: true}
	}
	return wants
}

// treeWants is what the files installed under a root look like to
// checkTree: relative paths, directories included.
func treeWants(files map[string]shippedFile) map[string]fs.FileMode {
	wants := map[string]fs.FileMode{}
	for p, f := range files {
		wants[strings.TrimPrefix(p, "/")] = f.mode
	}
	for _, d := range parentsOf(files) {
		wants[strings.TrimPrefix(d, "/")] = fs.ModeDir | 0o755
	}
	return wants
}

// checkCopyright checks the Debian copyright file against the machine-
// readable format (DEP-5): deb822 paragraphs of known fields, continuation
// lines indented (an empty one as " ."), a header paragraph, and a Files: *
// paragraph whose License names the license by its short name, with its
// text in a stand-alone License paragraph.
func checkCopyright(t *testing.T, root, c string) {
	t.Helper()
	known := []string{"Format", "Upstream-Name", "Upstream-Contact", "Source", "Disclaimer", "Comment", "License", "Copyright", "Files"}
	var paras []map[string]string
	for i, p := range strings.Split(strings.TrimSuffix(c, "\n"), "\n\n") {
		fields := map[string]string{}
		last := ""
		for _, line := range strings.Split(p, "\n") {
			if strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t") {
				if last == "" || strings.TrimSpace(line) == "" {
					t.Errorf("copyright paragraph %d: bad continuation line %q", i, line)
				}
				fields[last] += "\n" + strings.TrimSpace(line)
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if !ok || !slices.Contains(known, k) {
				t.Errorf("copyright paragraph %d: %q is not a DEP-5 field", i, line)
				continue
			}
			last, fields[k] = k, strings.TrimSpace(v)
		}
		paras = append(paras, fields)
	}
	if len(paras) == 0 || paras[0]["Format"] != "https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/" || paras[0]["Upstream-Name"] != name {
		t.Fatalf("copyright header paragraph: %v", paras)
	}
	if _, err := os.Stat(filepath.Join(root, "LICENSE")); err != nil {
		return
	}
	var files, text bool
	for _, p := range paras[1:] {
		first, _, _ := strings.Cut(p["License"], "\n")
		switch {
		case p["Files"] == "*":
			files = first == "Apache-2.0" && p["Copyright"] != ""
		case p["Files"] == "" && first == "Apache-2.0":
			text = strings.Contains(p["License"], "Apache License")
		}
	}
	if !files || !text {
		t.Errorf("copyright has no Files: * paragraph with License: Apache-2.0 (%v) or no stand-alone Apache-2.0 text (%v):\n%s", files, text, c)
	}
}

// checkUnitsVerify runs systemd-analyze verify on the units installed under
// installed, in a root of their own with the host's units (the targets they
// name) and a /bin/sh (ExecCondition's): what a distro's checks run. A unit
// with a bad ExecStart must fail the same check.
func checkUnitsVerify(t *testing.T, installed string) {
	t.Helper()
	need(t, "systemd-analyze")
	hostUnits := "/usr/lib/systemd/system"
	if _, err := os.Stat(filepath.Join(hostUnits, "multi-user.target")); err != nil {
		hostUnits = "/lib/systemd/system"
	}
	vroot := t.TempDir()
	units := filepath.Join(vroot, "usr/lib/systemd/system")
	for _, d := range []string{units, filepath.Join(vroot, "opt/cni/bin"), filepath.Join(vroot, "bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run(t, "", cleanEnv(), nil, "cp", "-a", hostUnits+"/.", units+"/")
	run(t, "", cleanEnv(), nil, "cp", "/bin/sh", filepath.Join(vroot, "bin/sh"))
	run(t, "", cleanEnv(), nil, "cp", filepath.Join(installed, "opt/cni/bin", name), filepath.Join(vroot, "opt/cni/bin", name))
	ours, err := filepath.Glob(filepath.Join(installed, "usr/lib/systemd/system", name+"-*"))
	if err != nil || len(ours) != 5 {
		t.Fatalf("installed units: %v, %v; want 5", ours, err)
	}
	args := []string{"systemd-analyze", "verify", "--root=" + vroot}
	for _, u := range ours {
		run(t, "", cleanEnv(), nil, "cp", u, units)
		args = append(args, filepath.Join(units, filepath.Base(u)))
	}
	if stdout, stderr, err := runErr(t, "", cleanEnv(), nil, args...); err != nil || stdout+stderr != "" {
		t.Errorf("systemd-analyze verify: %v\n%s%s", err, stdout, stderr)
	}
	broken := filepath.Join(units, "nbc-broken.service")
	if err := os.WriteFile(broken, []byte("[Service]\nExecStart=/opt/cni/bin/no-such-binary\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runErr(t, "", cleanEnv(), nil, "systemd-analyze", "verify", "--root="+vroot, broken); err == nil {
		t.Error("systemd-analyze verify passed a unit whose ExecStart does not exist: the check proves nothing")
	}

}
