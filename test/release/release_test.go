package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/md5"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/elfcheck"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

const (
	name   = "nomad-bridge-cni"
	module = "github.com/nomad-bridge-cni/nomad-bridge-cni"
)

// need skips (or, with CI set, fails) when a tool the release needs is missing.
func need(t *testing.T, tools ...string) {
	t.Helper()
	var missing []string
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) == 0 {
		return
	}
	testhost.SkipOrFail(t, fmt.Sprintf("release test needs %s: not found in PATH", strings.Join(missing, ", ")))
}

// repoRoot is the checkout this test belongs to (go test runs in test/release).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "scripts", "release", "release.sh")); err != nil {
		t.Fatalf("release script: %v", err)
	}
	return root
}

// cleanEnv is the environment minus what would change the release.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "VERSION", "DIST", "SOURCE_DATE_EPOCH", "DEB_MAINTAINER", "GO":
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// run runs a command and returns its stdout; stderr goes to the test log on failure.
func run(t *testing.T, dir string, env []string, stdin []byte, argv ...string) string {
	t.Helper()
	out, errOut, err := runErr(t, dir, env, stdin, argv...)
	if err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(argv, " "), err, out, errOut)
	}
	return out
}

func runErr(t *testing.T, dir string, env []string, stdin []byte, argv ...string) (string, string, error) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = env
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// ---------------------------------------------------------------------------
// Version mapping

func TestVersionMapping(t *testing.T) {
	need(t, "bash", "dpkg")
	root := repoRoot(t)
	script := filepath.Join(root, "scripts", "release", "release.sh")
	printVersion := func(t *testing.T, version string) (string, string, error) {
		t.Helper()
		var env []string
		if version != "" {
			env = cleanEnv("VERSION=" + version)
		} else {
			env = cleanEnv()
		}
		out, errOut, err := runErr(t, root, env, nil, "bash", script, "--print-version")
		if err != nil {
			return "", "", fmt.Errorf("%v: %s", err, errOut)
		}
		var v, d string
		if _, err := fmt.Sscanf(out, "version %s\ndeb-version %s\n", &v, &d); err != nil {
			return "", "", fmt.Errorf("output %q: %v", out, err)
		}
		return v, d, nil
	}

	for _, c := range []struct{ in, deb string }{
		{"v1.2.3", "1.2.3"},
		{"v1.2.3-4-gabcdef0", "1.2.3+git4.abcdef0"},
		{"v1.2.3-4-gabcdef0-dirty", "1.2.3+git4.abcdef0.dirty"},
		{"v1.2.3-dirty", "1.2.3+dirty"},
		{"v0.1.0-git18.g0abc123", "0.1.0~git18.0abc123"},
		{"v0.1.0-git18.g0abc123-dirty", "0.1.0~git18.0abc123+dirty"},
		{"v1.2.3-rc.1", "1.2.3~rc.1"},
		{"v1.2.3-rc.1-2-gabcdef0", "1.2.3~rc.1+git2.abcdef0"},
		{"v1.2.3+build.7", "1.2.3+build.7"},
		{"v1.2.3-rc-1+b-2", "1.2.3~rc.1+b.2"},
	} {
		v, d, err := printVersion(t, c.in)
		if err != nil {
			t.Errorf("VERSION=%s: %v", c.in, err)
			continue
		}
		if v != c.in || d != c.deb {
			t.Errorf("VERSION=%s: version %q, deb-version %q; want %q, %q", c.in, v, d, c.in, c.deb)
		}
	}
	for _, bad := range []string{"1.2.3", "v1.2", "v1.2.3 x", "v1.2.3-é", "v1.2.3+", "v1.2.3\n-X main.x=y"} {
		if v, d, err := printVersion(t, bad); err == nil {
			t.Errorf("VERSION=%q accepted: %q, %q", bad, v, d)
		}
	}

	// Debian order must follow release order, or apt will not upgrade.
	order := []string{"0.1.0~git18.0abc123", "0.1.0~git18.0abc123+dirty", "0.1.0", "0.1.0+git3.abcdef0",
		"1.2.3~rc.1", "1.2.3~rc.1+git2.abcdef0", "1.2.3", "1.2.3+dirty", "1.2.3+git4.abcdef0", "1.2.4~rc.1"}
	for i := 1; i < len(order); i++ {
		if _, errOut, err := runErr(t, root, cleanEnv(), nil, "dpkg", "--compare-versions", order[i-1], "lt", order[i]); err != nil || errOut != "" {
			t.Errorf("dpkg --compare-versions %s lt %s: %v %s", order[i-1], order[i], err, errOut)
		}
	}

	// The .rpm's Version is the same string: rpm must sort it the same way.
	t.Run("rpm-order", func(t *testing.T) {
		need(t, "rpm")
		for i := 1; i < len(order); i++ {
			expr := fmt.Sprintf(`%%{lua:print(rpm.vercmp("%s", "%s"))}`, order[i-1], order[i])
			if out, errOut, err := runErr(t, root, cleanEnv(), nil, "rpm", "--eval", expr); err != nil || strings.TrimSpace(out) != "-1" {
				t.Errorf("rpm.vercmp(%s, %s) = %q, want -1: %v %s", order[i-1], order[i], out, err, errOut)
			}
		}
	})

	// Without VERSION the version comes from git, in one of the documented forms.
	need(t, "git")
	v, d, err := printVersion(t, "")
	if err != nil {
		t.Fatalf("derived version: %v", err)
	}
	if !regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)??(-[0-9]+-g[0-9a-f]+|-git[0-9]+\.g[0-9a-f]+)?(-dirty)?$`).MatchString(v) {
		t.Errorf("derived version %q is not a git-describe form", v)
	}
	t.Logf("derived version %s, Debian %s", v, d)
}

// ---------------------------------------------------------------------------
// The release

func TestRelease(t *testing.T) {
	need(t, "bash", "go", "git", "tar", "gzip", "sha256sum", "dpkg", "dpkg-deb", "dpkg-query")
	root := repoRoot(t)
	script := filepath.Join(root, "scripts", "release", "release.sh")
	head := func() string {
		return strings.TrimSpace(run(t, root, cleanEnv(), nil, "git", "-C", root, "rev-parse", "HEAD"))
	}
	headBefore := head()
	commitTime := strings.TrimSpace(run(t, root, cleanEnv(), nil, "git", "-C", root, "log", "-1", "--format=%ct", "HEAD"))

	// As `make release` runs it: version and date from git.
	distA := filepath.Join(t.TempDir(), "dist")
	out := run(t, root, cleanEnv("DIST="+distA), nil, "bash", script)
	t.Logf("release.sh output:\n%s", out)
	if h := head(); h != headBefore {
		t.Fatalf("HEAD moved from %s to %s while the release was built (a concurrent commit): run the test again", headBefore, h)
	}

	// The six artifacts and SHA256SUMS, nothing else.
	entries, err := os.ReadDir(distA)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		files = append(files, e.Name())
	}
	var version, debVersion string
	for _, f := range files {
		if m := regexp.MustCompile(`^` + name + `-linux-amd64-(v.+)\.tgz$`).FindStringSubmatch(f); m != nil {
			version = m[1]
		}
		if m := regexp.MustCompile(`^` + name + `_(.+)_amd64\.deb$`).FindStringSubmatch(f); m != nil {
			debVersion = m[1]
		}
	}
	if version == "" || debVersion == "" {
		t.Fatalf("dist holds %v: no amd64 tarball or .deb", files)
	}
	tgz := func(arch string) string { return name + "-linux-" + arch + "-" + version + ".tgz" }
	deb := func(arch string) string { return name + "_" + debVersion + "_" + arch + ".deb" }
	rpm := func(arch string) string { return name + "-" + debVersion + "-1." + rpmArch[arch] + ".rpm" }
	artifacts := []string{tgz("amd64"), tgz("arm64"), deb("amd64"), deb("arm64"), rpm("amd64"), rpm("arm64")}
	if want := append(slices.Clone(artifacts), "SHA256SUMS"); !sameSet(files, want) {
		t.Fatalf("dist holds %v, want %v", files, want)
	}
	t.Logf("version %s, Debian version %s", version, debVersion)

	// The derived version is what --print-version says, and maps to the .deb's.
	pv := run(t, root, cleanEnv(), nil, "bash", script, "--print-version")
	if want := fmt.Sprintf("version %s\ndeb-version %s\n", version, debVersion); pv != want {
		t.Errorf("--print-version = %q, artifacts say %q", pv, want)
	}

	t.Run("SHA256SUMS", func(t *testing.T) { checkSums(t, distA, artifacts) })

	if _, err := os.Stat(filepath.Join(root, "LICENSE")); err != nil {
		t.Logf("no LICENSE in %s: the release ships without one", root)
	}

	bins := map[string][]byte{}
	for _, arch := range []string{"amd64", "arm64"} {
		t.Run("tarball-"+arch, func(t *testing.T) {
			bins[arch] = checkTarball(t, root, filepath.Join(distA, tgz(arch)), commitTime)
		})
	}
	t.Run("amd64-binary-runs", func(t *testing.T) {
		bin := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(bin, bins["amd64"], 0o755); err != nil {
			t.Fatal(err)
		}
		checkELF(t, bin, "amd64", version)
		checkRuns(t, bin, version)
	})
	t.Run("arm64-binary-elf", func(t *testing.T) {
		bin := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(bin, bins["arm64"], 0o755); err != nil {
			t.Fatal(err)
		}
		checkELF(t, bin, "arm64", version)
	})
	for _, arch := range []string{"amd64", "arm64"} {
		t.Run("deb-"+arch, func(t *testing.T) {
			checkDeb(t, root, filepath.Join(distA, deb(arch)), arch, debVersion, bins[arch], commitTime)
		})
	}
	t.Run("deb-amd64-dpkg-x", func(t *testing.T) {
		dir := t.TempDir()
		run(t, dir, cleanEnv(), nil, "dpkg", "-x", filepath.Join(distA, deb("amd64")), dir)
		checkTree(t, dir, treeWants(shipped(t, root, "deb")))
		checkRuns(t, filepath.Join(dir, "opt", "cni", "bin", name), version)
	})
	t.Run("deb-amd64-dpkg-root", func(t *testing.T) {
		checkDpkgRoot(t, root, filepath.Join(distA, deb("amd64")), debVersion, version)
	})
	for _, arch := range []string{"amd64", "arm64"} {
		t.Run("rpm-"+arch, func(t *testing.T) {
			checkRpm(t, root, filepath.Join(distA, rpm(arch)), arch, debVersion, bins[arch], commitTime)
		})
	}
	t.Run("rpm-amd64-rpm-root", func(t *testing.T) {
		checkRpmRoot(t, root, filepath.Join(distA, rpm("amd64")), debVersion, version)
	})

	// A second build of the same commit, now with VERSION and SOURCE_DATE_EPOCH
	// given, is byte-for-byte the same.
	t.Run("reproducible", func(t *testing.T) {
		if testing.Short() {
			t.Skip("-short: the second build is skipped")
		}
		distB := filepath.Join(t.TempDir(), "dist")
		run(t, root, cleanEnv("DIST="+distB, "VERSION="+version, "SOURCE_DATE_EPOCH="+commitTime), nil, "bash", script)
		a, _ := os.ReadFile(filepath.Join(distA, "SHA256SUMS"))
		b, _ := os.ReadFile(filepath.Join(distB, "SHA256SUMS"))
		if !bytes.Equal(a, b) {
			t.Errorf("second build differs (a file of the tree changed meanwhile?):\nfirst:\n%s\nsecond:\n%s", a, b)
		}
	})
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// checkSums verifies SHA256SUMS with sha256sum -c and by itself: one line per
// artifact, in sha256sum's text format.
func checkSums(t *testing.T, dist string, artifacts []string) {
	out := run(t, dist, cleanEnv(), nil, "sha256sum", "--strict", "-c", "SHA256SUMS")
	for _, a := range artifacts {
		if !strings.Contains(out, a+": OK\n") {
			t.Errorf("sha256sum -c output lacks %s: OK:\n%s", a, out)
		}
	}
	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	var named []string
	for line := range strings.Lines(string(sums)) {
		hash, file, ok := strings.Cut(strings.TrimSuffix(line, "\n"), "  ")
		if !ok || len(hash) != 64 {
			t.Errorf("SHA256SUMS line %q is not '<sha256>  <file>'", line)
			continue
		}
		data, err := os.ReadFile(filepath.Join(dist, file))
		if err != nil {
			t.Errorf("SHA256SUMS names %s: %v", file, err)
			continue
		}
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != hash {
			t.Errorf("%s: sha256 %x, SHA256SUMS says %s", file, sum, hash)
		}
		named = append(named, file)
	}
	if !sameSet(named, artifacts) {
		t.Errorf("SHA256SUMS covers %v, want %v", named, artifacts)
	}
}

// ---------------------------------------------------------------------------
// Archives

type entry struct {
	hdr  *tar.Header
	data []byte
}

func readTar(t *testing.T, r io.Reader) []entry {
	t.Helper()
	var es []entry
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return es
		}
		if err != nil {
			t.Fatalf("reading tar: %v", err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("reading %s: %v", hdr.Name, err)
		}
		es = append(es, entry{hdr, data})
	}
}

type want struct {
	mode fs.FileMode
	dir  bool
	data []byte // nil: not compared
}

// checkEntries compares a tar's entries with want exactly: names, types,
// modes, owner 0:0 (names empty or root), one timestamp, the commit time.
func checkEntries(t *testing.T, what string, es []entry, wants map[string]want, owner string, commitTime string) map[string][]byte {
	t.Helper()
	got, names := checkEntriesAnyOrder(t, what, es, wants, owner, commitTime)
	if !slices.IsSorted(names) {
		t.Errorf("%s: entries not sorted by name: %v", what, names)
	}
	return got
}

// checkEntriesAnyOrder is checkEntries for a tar whose order is its
// writer's (nfpm's control archive: control, md5sums, conffiles, then the
// maintainer scripts), and returns the names in that order.
func checkEntriesAnyOrder(t *testing.T, what string, es []entry, wants map[string]want, owner string, commitTime string) (map[string][]byte, []string) {
	t.Helper()
	got := map[string][]byte{}
	var names []string
	for _, e := range es {
		h := e.hdr
		names = append(names, h.Name)
		w, ok := wants[h.Name]
		if !ok {
			t.Errorf("%s: unexpected entry %s", what, h.Name)
			continue
		}
		if w.dir != (h.Typeflag == tar.TypeDir) || (!w.dir && h.Typeflag != tar.TypeReg) {
			t.Errorf("%s: %s has type %q, want dir=%v", what, h.Name, h.Typeflag, w.dir)
		}
		if m := fs.FileMode(h.Mode & 0o7777); m != w.mode {
			t.Errorf("%s: %s has mode %#o, want %#o", what, h.Name, m, w.mode)
		}
		if h.Uid != 0 || h.Gid != 0 || h.Uname != owner || h.Gname != owner {
			t.Errorf("%s: %s owned by %d:%d (%q:%q), want 0:0 (%q)", what, h.Name, h.Uid, h.Gid, h.Uname, h.Gname, owner)
		}
		if ts := fmt.Sprint(h.ModTime.Unix()); ts != commitTime {
			t.Errorf("%s: %s dated %s, want the commit time %s", what, h.Name, ts, commitTime)
		}
		if w.data != nil && !bytes.Equal(e.data, w.data) {
			t.Errorf("%s: %s differs from the source tree's", what, h.Name)
		}
		got[h.Name] = e.data
	}
	var wantNames []string
	for n := range wants {
		wantNames = append(wantNames, n)
	}
	if !sameSet(names, wantNames) {
		t.Errorf("%s holds %v, want %v", what, names, wantNames)
	}
	return got, names
}

func readRepo(t *testing.T, root, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkTarball checks the tarball's layout: rooted at /, what shipped
// lists for it (nothing but the binary in /opt/cni/bin), and returns the
// binary.
func checkTarball(t *testing.T, root, path string, commitTime string) []byte {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if zr.Name != "" || !zr.ModTime.IsZero() {
		t.Errorf("gzip header records name %q, time %v (want gzip -n)", zr.Name, zr.ModTime)
	}
	wants := tarWants(t, root, shipped(t, root, "tgz"), "./")
	wants["./"] = want{mode: 0o755, dir: true}
	got := checkEntries(t, filepath.Base(path), readTar(t, zr), wants, "", commitTime)
	bin := got["./opt/cni/bin/"+name]
	checkThirdPartyLicenses(t, bin, got["./usr/share/doc/"+name+"/THIRD_PARTY_LICENSES"])
	return bin
}

// checkThirdPartyLicenses checks that the shipped licenses cover what the
// binary links, as its build information lists it: the Go standard library
// and every module, each with the text of a license file.
func checkThirdPartyLicenses(t *testing.T, bin, licenses []byte) {
	t.Helper()
	info, err := buildinfo.Read(bytes.NewReader(bin))
	if err != nil {
		t.Fatalf("build info of the shipped binary: %v", err)
	}
	text := string(licenses)
	want := []string{"==== Go standard library " + info.GoVersion + ": LICENSE ===="}
	for _, dep := range info.Deps {
		want = append(want, "==== "+dep.Path+" "+dep.Version+": ")
	}
	for _, w := range want {
		i := strings.Index(text, w)
		if i < 0 {
			t.Errorf("THIRD_PARTY_LICENSES has no section %q", w)
			continue
		}
		if body := text[i+len(w):]; !strings.Contains(body[:min(len(body), 4096)], "ermission") && !strings.Contains(body[:min(len(body), 4096)], "icense") {
			t.Errorf("THIRD_PARTY_LICENSES section %q holds no license text", w)
		}
	}
	if len(info.Deps) == 0 {
		t.Error("the binary's build information lists no module")
	}
}

// checkDeb checks a .deb with dpkg-deb and by reading its members.
func checkDeb(t *testing.T, root, path, arch, debVersion string, bin []byte, commitTime string) {
	env := cleanEnv()
	// Control fields.
	fields := parseControl(run(t, "", env, nil, "dpkg-deb", "--field", path))
	for k, v := range map[string]string{
		"Package": name, "Version": debVersion, "Architecture": arch,
		"Section": "net", "Priority": "optional", "Recommends": "containernetworking-plugins",
	} {
		if fields[k] != v {
			t.Errorf("control %s = %q, want %q", k, fields[k], v)
		}
	}
	for _, k := range []string{"Maintainer", "Installed-Size", "Description", "Homepage"} {
		if fields[k] == "" {
			t.Errorf("control field %s missing", k)
		}
	}
	for _, k := range []string{"Depends", "Pre-Depends", "Conflicts", "Breaks", "Replaces", "Essential"} {
		if v, ok := fields[k]; ok {
			t.Errorf("control has %s: %q, want none", k, v)
		}
	}
	if !strings.Contains(fields["Description"], "/usr/lib/cni") {
		t.Errorf("Description does not tell where Debian's containernetworking-plugins are:\n%s", fields["Description"])
	}

	// Control archive: control, md5sums, the conffile, and the maintainer
	// scripts of packaging/deb (nfpm writes no "./" entry here and leaves
	// the owner names empty).
	ctrl, _ := checkEntriesAnyOrder(t, "control.tar of "+filepath.Base(path),
		readTar(t, pipe(t, "dpkg-deb", "--ctrl-tarfile", path)),
		map[string]want{
			"./control": {mode: 0o644}, "./md5sums": {mode: 0o644},
			"./conffiles": {mode: 0o644, data: []byte("/etc/default/" + name + "\n")},
			"./postinst":  {mode: 0o755, data: readRepo(t, root, "packaging/deb/postinst")},
			"./prerm":     {mode: 0o755, data: readRepo(t, root, "packaging/deb/prerm")},
			"./postrm":    {mode: 0o755, data: readRepo(t, root, "packaging/deb/postrm")},
		},
		"", commitTime)

	// Data archive: exactly what shipped lists, root:root (no "./" entry:
	// nfpm writes none).
	doc := "./usr/share/doc/" + name + "/"
	wants := tarWants(t, root, shipped(t, root, "deb"), "./")
	wants["./opt/cni/bin/"+name] = want{mode: 0o755, data: bin}
	data := checkEntries(t, "data.tar of "+filepath.Base(path),
		readTar(t, pipe(t, "dpkg-deb", "--fsys-tarfile", path)), wants, "root", commitTime)
	checkThirdPartyLicenses(t, bin, data[doc+"THIRD_PARTY_LICENSES"])

	// md5sums covers every file, with the right sums.
	sums := map[string]string{}
	for line := range strings.Lines(string(ctrl["./md5sums"])) {
		sum, file, ok := strings.Cut(strings.TrimSuffix(line, "\n"), "  ")
		if !ok {
			t.Errorf("md5sums line %q", line)
		}
		sums["./"+file] = sum
	}
	for n, b := range data {
		if strings.HasSuffix(n, "/") {
			continue
		}
		if s := md5.Sum(b); sums[n] != hex.EncodeToString(s[:]) {
			t.Errorf("md5sums: %s is %q, want %x", n, sums[n], s)
		}
		delete(sums, n)
	}
	if len(sums) > 0 {
		t.Errorf("md5sums lists files not in the package: %v", sums)
	}
	checkCopyright(t, root, string(data[doc+"copyright"]))
}

// parseControl parses one deb822 paragraph; continuation lines are kept.
func parseControl(s string) map[string]string {
	fields := map[string]string{}
	var last string
	for line := range strings.Lines(s) {
		line = strings.TrimSuffix(line, "\n")
		if strings.HasPrefix(line, " ") && last != "" {
			fields[last] += "\n" + line
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if ok {
			last = k
			fields[k] = strings.TrimSpace(v)
		}
	}
	return fields
}

// pipe returns a command's stdout; it fails the test if the command fails.
func pipe(t *testing.T, argv ...string) io.Reader {
	t.Helper()
	return strings.NewReader(run(t, "", cleanEnv(), nil, argv...))
}

// checkTree compares the files under dir with want (relative path -> type and mode).
func checkTree(t *testing.T, dir string, wants map[string]fs.FileMode) {
	t.Helper()
	got := map[string]fs.FileMode{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		got[rel] = info.Mode() & (fs.ModeType | fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for p, m := range wants {
		if g, ok := got[p]; !ok {
			t.Errorf("%s missing", p)
		} else if g != m {
			t.Errorf("%s has mode %v, want %v", p, g, m)
		}
		delete(got, p)
	}
	for p := range got {
		t.Errorf("unexpected %s", p)
	}
}

// ---------------------------------------------------------------------------
// Binaries

// checkRuns runs the plugin as Nomad's fingerprinter and a runtime's VERSION
// call would.
func checkRuns(t *testing.T, bin, version string) {
	t.Helper()
	// An installed plugin's environment: nothing but PATH.
	opts := cniexec.Opts{Base: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}}
	if r, want := cniexec.Run(t, bin, invoke.Args{}, opts), "CNI "+name+" plugin "+version+"\n"; r.Err != nil || r.Stdout != want {
		t.Errorf("%s with no args: want %q on stdout and exit 0\n%s", bin, want, r)
	}
	r := cniexec.Run(t, bin, invoke.Args{Command: "VERSION"}, opts)
	out := r.Stdout
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	var v struct {
		CNIVersion        string   `json:"cniVersion"`
		SupportedVersions []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("CNI_COMMAND=VERSION printed %q: %v", out, err)
	}
	if v.CNIVersion == "" || !slices.Contains(v.SupportedVersions, "1.1.0") || !slices.Contains(v.SupportedVersions, "1.0.0") {
		t.Errorf("CNI_COMMAND=VERSION printed %s, want a cniVersion and supportedVersions with 1.0.0 and 1.1.0", out)
	}
}

// checkELF checks a binary without running it (see internal/elfcheck).
func checkELF(t *testing.T, path, arch string, version string) {
	t.Helper()
	if _, problems := elfcheck.Check(arch, path, module, version); len(problems) > 0 {
		t.Errorf("%s: %s", path, strings.Join(problems, "; "))
	}
}

// ---------------------------------------------------------------------------
// dpkg --root

// checkDpkgRoot installs the package with dpkg into a throw-away root (its own
// admin dir: the host's dpkg database is not touched), verifies it, runs the
// installed plugin, and purges it: nothing may be left outside dpkg's own dir.
// The maintainer scripts run (chrootless, with DPKG_ROOT set: they touch only
// the root): the install enables the units there as deb-systemd-helper does,
// the purge takes them back.
func checkDpkgRoot(t *testing.T, repo, deb, debVersion, version string) {
	need(t, "deb-systemd-helper")
	root := t.TempDir()
	admin := filepath.Join(root, "var", "lib", "dpkg")
	for _, d := range []string{"updates", "info"} {
		if err := os.MkdirAll(filepath.Join(admin, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(admin, "status"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// dpkg insists on finding ldconfig and start-stop-daemon in PATH.
	env := cleanEnv("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	dpkg := func(args ...string) string {
		return run(t, "", env, nil, append([]string{"dpkg", "--root=" + root, "--admindir=" + admin,
			"--force-not-root", "--force-script-chrootless", "--log=/dev/null"}, args...)...)
	}
	dpkg("--install", deb)
	st := run(t, "", env, nil, "dpkg-query", "--admindir="+admin, "--show", "--showformat=${db:Status-Abbrev}|${Version}", name)
	if want := "ii |" + debVersion; st != want {
		t.Errorf("dpkg-query says %q, want %q", st, want)
	}
	if out := dpkg("--verify", name); out != "" {
		t.Errorf("dpkg --verify:\n%s", out)
	}
	for _, s := range []string{"postinst", "prerm", "postrm"} {
		if _, err := os.Stat(filepath.Join(admin, "info", name+"."+s)); err != nil {
			t.Errorf("package installed no %s: %v", s, err)
		}
	}
	for _, link := range []string{
		"etc/systemd/system/timers.target.wants/nomad-bridge-cni-gc.timer",
		"etc/systemd/system/timers.target.wants/nomad-bridge-cni-metrics.timer",
		"etc/systemd/system/multi-user.target.wants/nomad-bridge-cni-boot.service",
	} {
		target, err := os.Readlink(filepath.Join(root, link))
		if err != nil || target != "/usr/lib/systemd/system/"+filepath.Base(link) {
			t.Errorf("postinst did not enable %s: %q, %v", filepath.Base(link), target, err)
		}
	}
	checkUnitsVerify(t, root)
	checkRuns(t, filepath.Join(root, "opt", "cni", "bin", name), version)

	dpkg("--purge", name)
	// deb-systemd-helper makes the directories of its symlinks and state
	// when the root has none (on a host, systemd's package owns them), and
	// leaves them: empty directories, nothing else.
	helperDirs := []string{"etc", "etc/systemd", "etc/systemd/system", "var/lib/systemd"}
	var left []string
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == admin {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(root, p)
		if slices.Contains([]string{".", "var", "var/lib"}, rel) || (d.IsDir() && slices.Contains(helperDirs, rel)) {
			return nil
		}
		left = append(left, rel)
		return nil
	})
	if len(left) > 0 {
		t.Errorf("purge left %v", left)
	}
}
