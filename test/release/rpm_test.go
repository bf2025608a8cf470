package release

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// rpmArch is rpm's name for each GOARCH of the release.
var rpmArch = map[string]string{"amd64": "x86_64", "arm64": "aarch64"}

// rpmFile is one file of an rpm header, as rpm -qp prints it.
type rpmFile struct {
	mode, user, group, mtime, flags, digest string
}

// rpmQuery runs `rpm -qp --queryformat` on a package file. Debian's rpm warns
// on stderr that rpm should not install packages; only stdout is read.
func rpmQuery(t *testing.T, pkg, format string) string {
	t.Helper()
	return run(t, "", cleanEnv(), nil, "rpm", "-qp", "--queryformat", format, pkg)
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// checkRpm checks an .rpm with rpm itself: its digests, its metadata, the
// scriptlets of packaging/rpm and no trigger, no dependency but rpm's own
// features, and exactly the files shipped lists, with their modes, owners,
// dates, %doc/%license/%config flags and contents.
func checkRpm(t *testing.T, root, path, arch, version string, bin []byte, commitTime string) {
	need(t, "rpm")
	env := cleanEnv()
	if out := run(t, "", env, nil, "rpm", "--checksig", "--nosignature", path); !strings.HasSuffix(out, ": digests OK\n") {
		t.Errorf("rpm --checksig --nosignature: %q", out)
	}

	fields := strings.Split(rpmQuery(t, path,
		"%{NAME}\n%{VERSION}\n%{RELEASE}\n%{ARCH}\n%{OS}\n%{LICENSE}\n%{URL}\n%{SUMMARY}\n%{PACKAGER}\n%{BUILDTIME}\n%{BUILDHOST}"), "\n")
	if len(fields) != 11 {
		t.Fatalf("rpm -qp printed %q", fields)
	}
	for i, want := range []string{name, version, "1", rpmArch[arch], "linux", "Apache-2.0", "https://github.com/" + name + "/" + name,
		"CNI plugin: bridge with host-local leases on tmpfs"} {
		if fields[i] != want {
			t.Errorf("rpm header field %d is %q, want %q", i, fields[i], want)
		}
	}
	if fields[8] == "" || fields[8] == "(none)" {
		t.Error("rpm has no Packager")
	}
	if fields[9] != commitTime {
		t.Errorf("rpm build time %s, want the commit time %s", fields[9], commitTime)
	}
	if h, _ := os.Hostname(); fields[10] == h {
		t.Errorf("rpm build host is this machine's name %q: two builders would differ", h)
	}
	if d := rpmQuery(t, path, "%{DESCRIPTION}"); !strings.Contains(d, "/usr/libexec/cni") || strings.Contains(d, "/usr/lib/cni") || strings.Contains(d, "Debian") {
		t.Errorf("Description does not tell where an RPM distribution's containernetworking-plugins are, or names Debian's:\n%s", d)
	}

	if out := run(t, "", env, nil, "rpm", "-qp", "--triggers", path); out != "" {
		t.Errorf("rpm has triggers:\n%s", out)
	}
	for tag, file := range map[string]string{"POSTIN": "post.sh", "PREUN": "preun.sh", "POSTUN": "postun.sh", "PREIN": ""} {
		got := rpmQuery(t, path, "%{"+tag+"}")
		want := "(none)"
		if file != "" {
			want = strings.TrimSuffix(string(readRepo(t, root, "packaging/rpm/"+file)), "\n")
		}
		if strings.TrimSuffix(got, "\n") != want {
			t.Errorf("rpm %s scriptlet:\n%s\nwant:\n%s", tag, got, want)
		}
	}
	for line := range strings.Lines(run(t, "", env, nil, "rpm", "-qpR", path)) {
		if !strings.HasPrefix(line, "rpmlib(") {
			t.Errorf("rpm requires %q, want only rpmlib() features", strings.TrimSpace(line))
		}
	}
	if out := run(t, "", env, nil, "rpm", "-qp", "--recommends", path); out != "containernetworking-plugins\n" {
		t.Errorf("rpm recommends %q, want containernetworking-plugins", out)
	}
	for _, tag := range []string{"--conflicts", "--obsoletes", "--supplements", "--enhances", "--suggests"} {
		if out := run(t, "", env, nil, "rpm", "-qp", tag, path); out != "" {
			t.Errorf("rpm %s: %q, want none", tag, out)
		}
	}

	// The files of shipped, and the directories the package owns.
	doc, lic := "/usr/share/doc/"+name, "/usr/share/licenses/"+name
	got := map[string]rpmFile{}
	for line := range strings.Lines(rpmQuery(t, path,
		"[%{FILENAMES}\t%{FILEMODES:octal}\t%{FILEUSERNAME}\t%{FILEGROUPNAME}\t%{FILEMTIMES}\t%{FILEFLAGS:fflags}\t%{FILEDIGESTS}\n]")) {
		f := strings.Split(strings.TrimSuffix(line, "\n"), "\t")
		if len(f) != 7 {
			t.Fatalf("rpm file line %q", line)
		}
		got[f[0]] = rpmFile{mode: f[1], user: f[2], group: f[3], mtime: f[4], flags: f[5], digest: f[6]}
	}
	wants := map[string]rpmFile{}
	for p, f := range shipped(t, root, "rpm") {
		w := rpmFile{mode: fmt.Sprintf("100%o", f.mode), flags: f.flags}
		if f.src != "" {
			w.digest = sha256Hex(readRepo(t, root, f.src))
		}
		wants[p] = w
	}
	wants["/opt/cni/bin/"+name] = rpmFile{mode: "100755", digest: sha256Hex(bin)}
	for _, d := range []string{doc, doc + "/docs", doc + "/examples", lic, "/usr/share/" + name, "/usr/share/" + name + "/prometheus"} {
		wants[d] = rpmFile{mode: "40755"}
	}
	for p, w := range wants {
		w.user, w.group, w.mtime = "root", "root", commitTime
		g, ok := got[p]
		if !ok {
			t.Errorf("rpm lacks %s", p)
			continue
		}
		if w.digest == "" {
			w.digest = g.digest
		}
		if g != w {
			t.Errorf("rpm %s is %+v, want %+v", p, g, w)
		}
		delete(got, p)
	}
	for p := range got {
		t.Errorf("rpm holds unexpected %s", p)
	}
}

// checkRpmRoot installs the package with rpm into a throw-away root (its own
// database inside it: the host's is not touched), verifies it, runs the
// installed plugin, checks its units with systemd-analyze, and erases it:
// only the parent directories the package does not own may be left. The
// scriptlets do not run: rpm runs them chrooted, and the root has no shell
// (checkRpm compares them with packaging/rpm).
func checkRpmRoot(t *testing.T, repo, pkg, rpmVersion, version string) {
	need(t, "rpm")
	if os.Geteuid() != 0 {
		testhost.SkipOrFail(t, "installing the .rpm into a throw-away root needs root (rpm sets owners)")
	}
	root := t.TempDir()
	env := cleanEnv()
	rpm := func(args ...string) string {
		return run(t, "", env, nil, append([]string{"rpm", "--root=" + root, "--dbpath=/var/lib/rpm"}, args...)...)
	}
	rpm("--initdb")
	// --nodeps: the throw-away root has no packages; Recommends is weak anyway.
	rpm("--install", "--nodeps", "--noscripts", pkg)
	if out := rpm("--query", "--queryformat", "%{VERSION}-%{RELEASE}", name); out != rpmVersion+"-1" {
		t.Errorf("rpm --query %s: %q, want %s-1", name, out, rpmVersion)
	}
	if out := rpm("--verify", name); out != "" {
		t.Errorf("rpm --verify:\n%s", out)
	}
	checkRuns(t, filepath.Join(root, "opt", "cni", "bin", name), version)
	checkUnitsVerify(t, root)

	rpm("--erase", "--noscripts", name)
	var left []string
	db := filepath.Join(root, "var", "lib", "rpm")
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == db {
			return filepath.SkipDir
		}
		if rel, _ := filepath.Rel(root, p); rel != "." {
			left = append(left, rel)
		}
		return nil
	})
	files := shipped(t, repo, "rpm")
	owned := []string{"/usr/share/doc/" + name, "/usr/share/doc/" + name + "/docs", "/usr/share/doc/" + name + "/examples", "/usr/share/licenses/" + name, "/usr/share/" + name, "/usr/share/" + name + "/prometheus"}
	var unowned []string
	for _, d := range parentsOf(files) {
		if !slices.Contains(owned, d) {
			unowned = append(unowned, strings.TrimPrefix(d, "/"))
		}
	}
	unowned = append(unowned, "var", "var/lib")
	if !sameSet(left, unowned) {
		t.Errorf("erase left %v, want only the unowned parents %v", left, unowned)
	}
}
