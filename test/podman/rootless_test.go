package podman

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/hostcmd"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// Rootless podman (CNI backend) runs the plugins in its rootless network
// namespace: a user, network and mount namespace of the user's, where
// slirp4netns gives the bridge its way out, the user's XDG_RUNTIME_DIR is
// bind-mounted and /run is a directory of podman's. The one-word network
// keeps its leases in the user's XDG_RUNTIME_DIR (a tmpfs).
//
// The operator commands must never take a live rootless container for a
// stale one. As root on the host they refuse the user's dataDir (it is not
// theirs: the plugin's safety check). Run as the user inside that
// namespace, `podman unshare --rootless-netns nomad-bridge-cni ...`, they
// see what the plugin sees: the container is live and nothing is
// released. Then podman's own DEL releases it.
func TestRootless(t *testing.T) {
	requireHost(t)
	requireRootless(t)
	id := fmt.Sprintf("%08x", rand.Uint32())
	u := newTestUser(t, "nbp"+id)
	e := newEnvFor(t, oneWord, id, u)
	n := e.addNetwork(t, "a")
	c := e.run(t, "web", n, withHostPort(t))
	addr := e.checkServes(t, c, n, "eth0")

	for _, args := range [][]string{
		{"leases", "--data-dir", e.tmpfs, "--json"},
		{"gc", "--dry-run", "--data-dir", e.tmpfs},
		{"gc", "--data-dir", e.tmpfs},
	} {
		_, stderr, err := e.operatorOnHost(args...)
		want := fmt.Sprintf("refusing %s: owned by uid %d, not by uid 0", e.tmpfs, u.uid)
		if err == nil || !strings.Contains(stderr, want) {
			t.Fatalf("nomad-bridge-cni %s as root on the host: %v, stderr %q; want it refused: %q", strings.Join(args, " "), err, stderr, want)
		}
		t.Logf("nomad-bridge-cni %s as root on the host, refused: %s", strings.Join(args, " "), strings.TrimSpace(stderr))
	}
	e.assertLease(t, n, addr, c.id, "eth0")
	e.assertRecord(t, n, c.id, "eth0", true)

	// As the user on the host, outside its namespaces, gc finds the
	// container's process in the recorded namespace but may not enter it:
	// it cannot tell, so it must keep it (it once released it).
	_, stderr, err := e.operatorAsUserOnHost("gc", "--data-dir", e.tmpfs)
	t.Logf("gc as %s on the host: %v\n%s", u.name, err, stderr)
	if strings.Contains(stderr, "released") {
		t.Fatalf("gc as the user on the host released something of a running container:\n%s", stderr)
	}
	e.assertLease(t, n, addr, c.id, "eth0")
	e.assertRecord(t, n, c.id, "eth0", true)

	var doc leasesDoc
	operatorJSON(t, e.operatorInRootlessNetns, &doc, "leases", "--data-dir", e.tmpfs)
	rows := doc.rowsOf(c.id)
	if len(rows) != 1 || rows[0].IP != addr.String() || rows[0].State != "live" {
		t.Fatalf("leases in the rootless network namespace: %+v, want %s live", rows, addr)
	}
	for _, args := range [][]string{{"gc", "--dry-run", "--data-dir", e.tmpfs}, {"gc", "--data-dir", e.tmpfs}} {
		var gc gcDoc
		operatorJSON(t, e.operatorInRootlessNetns, &gc, args...)
		if len(gc.Released) != 0 || len(gc.Problems) != 0 {
			t.Fatalf("nomad-bridge-cni %s in the rootless network namespace released %+v (problems %q), want nothing", strings.Join(args, " "), gc.Released, gc.Problems)
		}
	}
	if got := e.checkServes(t, c, n, "eth0"); got != addr {
		t.Fatalf("container moved from %s to %s", addr, got)
	}

	e.mustPodman(t, "stop", c.id)
	e.assertReleased(t, n, c.id, "eth0")
	e.start(t, c)
	e.checkServes(t, c, n, "eth0")
	e.mustPodman(t, "rm", "--force", "--time", "0", c.id)
	e.assertReleased(t, n, c.id, "eth0")
	if leases := e.leases(t, n); len(leases) != 0 {
		t.Errorf("leases left: %q", leases)
	}
}

// operatorAsUserOnHost runs the plugin's operator commands as the env's
// user in the host's namespaces.
func (e *env) operatorAsUserOnHost(args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, e.operatorBin(), args...)
	cmd.Env = hostcmd.CNIEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: e.user.credential()}
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// operatorInRootlessNetns runs the plugin's operator commands as the env's
// user in podman's rootless network namespace, with its mounts.
func (e *env) operatorInRootlessNetns(args ...string) (string, string, error) {
	return e.podmanOutput(append([]string{"unshare", "--rootless-netns", e.operatorBin()}, args...)...)
}

// ---------------------------------------------------------------------------
// Prerequisites

// rootlessTools: the account tools, shadow's setuid ID mappers, and the
// rootless network namespace's way out.
var rootlessTools = []string{"useradd", "userdel", "newuidmap", "newgidmap", "slirp4netns"}

// tunDevice is what slirp4netns opens, as the user.
const tunDevice = "/dev/net/tun"

// requireRootless skips (fails in CI) unless rootless podman can run here.
func requireRootless(t *testing.T) {
	t.Helper()
	if missing := missingRootlessPrereqs(); len(missing) > 0 {
		testhost.SkipOrFail(t, "rootless podman prerequisites missing: "+strings.Join(missing, "; ")+" (.ci/run installs uidmap and slirp4netns with apt-get)")
	}
	ensureTunUsable(t)
}

func missingRootlessPrereqs() []string {
	var missing []string
	for _, tool := range rootlessTools {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool+" in PATH")
		}
	}
	if fi, err := os.Stat(tunDevice); err != nil || fi.Mode()&fs.ModeCharDevice == 0 {
		missing = append(missing, "the character device "+tunDevice+fmt.Sprint(" ", err))
	}
	if raw, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err != nil || strings.TrimSpace(string(raw)) == "0" {
		missing = append(missing, fmt.Sprintf("user namespaces (user.max_user_namespaces %q, %v)", bytes.TrimSpace(raw), err))
	}
	if raw, err := os.ReadFile("/proc/sys/kernel/unprivileged_userns_clone"); err == nil && strings.TrimSpace(string(raw)) != "1" {
		missing = append(missing, "unprivileged user namespaces (kernel.unprivileged_userns_clone is "+strings.TrimSpace(string(raw))+")")
	}
	if _, err := user.LookupGroup(testUserGroup); err != nil {
		missing = append(missing, "the group "+testUserGroup+": "+err.Error())
	}
	return missing
}

// ensureTunUsable lets unprivileged users open the tun device for the
// test (udev's rule makes it 0666; hosts without udev may leave it 0600),
// and puts its mode back afterwards.
func ensureTunUsable(t *testing.T) {
	t.Helper()
	fi, err := os.Stat(tunDevice)
	if err != nil {
		t.Fatal(err)
	}
	mode := fi.Mode().Perm()
	if mode&0o006 == 0o006 {
		return
	}
	if err := os.Chmod(tunDevice, mode|0o006); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s was %v: opened to other users for the test", tunDevice, mode)
	t.Cleanup(func() {
		if err := os.Chmod(tunDevice, mode); err != nil {
			t.Errorf("restore the mode of %s: %v", tunDevice, err)
		}
	})
}

// ---------------------------------------------------------------------------
// The throw-away user

// testUserGroup is the test user's primary group, one every Debian system
// has: useradd creates no group of its own.
const testUserGroup = "nogroup"

// testUser is a system user created for one test, with subordinate user
// and group IDs for rootless podman.
type testUser struct {
	name           string
	uid, gid       uint32
	subuid, subgid idRange
}

// idRange is a line of /etc/subuid or /etc/subgid.
type idRange struct{ start, count uint64 }

func (r idRange) contains(id uint64) bool { return id >= r.start && id < r.start+r.count }

func (u *testUser) credential() *syscall.Credential {
	return &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: []uint32{}}
}

// runs reports whether process pid runs as the user or one of its
// subordinate IDs (any of its real, effective, saved or filesystem uids).
// A zombie does not run: it holds nothing but its exit status, until its
// parent (init, once the test killed the parent) reaps it.
func (u *testUser) runs(pid int) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	mine := false
	for sc.Scan() {
		if state, ok := strings.CutPrefix(sc.Text(), "State:"); ok {
			if f := strings.Fields(state); len(f) > 0 && (f[0] == "Z" || f[0] == "X") {
				return false
			}
		}
		rest, ok := strings.CutPrefix(sc.Text(), "Uid:")
		if !ok {
			continue
		}
		for _, f := range strings.Fields(rest) {
			if id, err := strconv.ParseUint(f, 10, 32); err == nil && (id == uint64(u.uid) || u.subuid.contains(id)) {
				mine = true
			}
		}
	}
	return mine
}

// chownTree gives the user everything under dir.
func (u *testUser) chownTree(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(u.uid), int(u.gid))
	})
	if err != nil {
		t.Fatalf("chown %s to %s: %v", dir, u.name, err)
	}
}

// accountFiles are what useradd and userdel rewrite; each also rewrites
// its backup, <file>-.
var accountFiles = []string{"/etc/passwd", "/etc/shadow", "/etc/group", "/etc/gshadow", "/etc/subuid", "/etc/subgid"}

// newTestUser creates the system user name (no home, no login, no group
// of its own, not in lastlog and faillog) with subordinate IDs, and
// registers its removal: its processes are killed, userdel removes it and
// its subordinate IDs, and the account files must then hold what they held
// before; their backups, which useradd and userdel rewrite, are put back.
func newTestUser(t *testing.T, name string) *testUser {
	t.Helper()
	before, err := snapshotAccountFiles()
	if err != nil {
		t.Fatal(err)
	}
	var u *testUser
	t.Cleanup(func() {
		if err := removeTestUser(name, u, before); err != nil {
			t.Errorf("remove the test user %s: %v", name, err)
		}
	})
	if _, err := user.Lookup(name); err == nil {
		t.Fatalf("user %s exists already", name)
	}
	if _, err := user.LookupGroup(name); err == nil {
		t.Fatalf("group %s exists (userdel would take it for the user's own)", name)
	}
	if err := hostcmd.Run(cmdTimeout, "useradd", "--system", "--add-subids-for-system", "--no-create-home", "--home-dir", "/nonexistent",
		"--shell", "/usr/sbin/nologin", "--gid", testUserGroup, "--no-log-init", name); err != nil {
		t.Fatal(err)
	}
	u, err = lookupTestUser(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("user %s: uid %d, gid %d, subordinate uids %d+%d, gids %d+%d", name, u.uid, u.gid, u.subuid.start, u.subuid.count, u.subgid.start, u.subgid.count)
	return u
}

func lookupTestUser(name string) (*testUser, error) {
	pw, err := user.Lookup(name)
	if err != nil {
		return nil, err
	}
	uid, err1 := strconv.ParseUint(pw.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(pw.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("user %s: %w", name, err)
	}
	u := &testUser{name: name, uid: uint32(uid), gid: uint32(gid)}
	if u.subuid, err = subIDs("/etc/subuid", u); err != nil {
		return u, err
	}
	u.subgid, err = subIDs("/etc/subgid", u)
	return u, err
}

// subIDs is the user's range in file (by name or uid).
func subIDs(file string, u *testUser) (idRange, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return idRange{}, err
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		f := strings.Split(strings.TrimSpace(line), ":")
		if len(f) != 3 || (f[0] != u.name && f[0] != strconv.FormatUint(uint64(u.uid), 10)) {
			continue
		}
		start, err1 := strconv.ParseUint(f[1], 10, 32)
		count, err2 := strconv.ParseUint(f[2], 10, 32)
		if err1 == nil && err2 == nil && count > 0 {
			return idRange{start, count}, nil
		}
	}
	return idRange{}, fmt.Errorf("%s has no range for %s", file, u.name)
}

// fileState is what an account file held: absent, or its bytes, mode,
// owner and mtime.
type fileState struct {
	exists   bool
	content  []byte
	mode     fs.FileMode
	uid, gid int
	mtime    time.Time
}

func statFile(path string) (fileState, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fileState{}, nil
	}
	if err != nil {
		return fileState{}, err
	}
	if !fi.Mode().IsRegular() {
		return fileState{}, fmt.Errorf("%s is not a regular file", path)
	}
	content, err := os.ReadFile(path)
	if err != nil {
		return fileState{}, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	return fileState{exists: true, content: content, mode: fi.Mode().Perm(), uid: int(st.Uid), gid: int(st.Gid), mtime: fi.ModTime()}, nil
}

func snapshotAccountFiles() (map[string]fileState, error) {
	out := map[string]fileState{}
	for _, f := range accountFiles {
		for _, p := range []string{f, f + "-"} {
			st, err := statFile(p)
			if err != nil {
				return nil, err
			}
			out[p] = st
		}
	}
	return out, nil
}

// removeTestUser kills what still runs as the user (u nil: useradd did not
// get that far), deletes it, checks that the account files hold what they
// held before, and only then puts their backups back. userdel is forced:
// it would refuse a user that zombies of its killed processes still name
// until init reaps them, and nothing else of the user's runs any more.
func removeTestUser(name string, u *testUser, before map[string]fileState) error {
	var errs []error
	for _, pid := range userProcesses(u) {
		if err := killAndWait(pid); err != nil {
			errs = append(errs, fmt.Errorf("process %d of %s: %w", pid, name, err))
		}
	}
	if _, err := user.Lookup(name); err == nil {
		if pids := userProcesses(u); len(errs) == 0 && len(pids) > 0 {
			errs = append(errs, fmt.Errorf("processes of %s still run: %v", name, pids))
		}
		if len(errs) > 0 {
			return errors.Join(append(errs, errors.New("the user is left in place"))...)
		}
		if err := hostcmd.Run(cmdTimeout, "userdel", "--force", name); err != nil {
			return errors.Join(append(errs, err)...)
		}
	}
	for _, f := range accountFiles {
		now, err := statFile(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if was := before[f]; now.exists != was.exists || !bytes.Equal(now.content, was.content) || now.mode != was.mode {
			errs = append(errs, fmt.Errorf("%s differs from before the test", f))
		}
	}
	if len(errs) > 0 {
		return errors.Join(append(errs, errors.New("the account files' backups are left as userdel wrote them"))...)
	}
	for _, f := range accountFiles {
		errs = append(errs, restoreFile(f, before[f]), restoreFile(f+"-", before[f+"-"]))
	}
	return errors.Join(errs...)
}

// restoreFile puts path back as it was (or removes it): its content only
// if it differs (never for the account files themselves, checked equal
// first: rewriting them in place would show readers a truncated file),
// then its owner, mode and mtime.
func restoreFile(path string, was fileState) error {
	now, err := statFile(path)
	if err != nil {
		return err
	}
	switch {
	case !was.exists && now.exists:
		return os.Remove(path)
	case !was.exists, now.exists && bytes.Equal(now.content, was.content) && now.mode == was.mode &&
		now.uid == was.uid && now.gid == was.gid && now.mtime.Equal(was.mtime):
		return nil
	}
	if !now.exists || !bytes.Equal(now.content, was.content) {
		if err := os.WriteFile(path, was.content, was.mode); err != nil {
			return err
		}
	}
	return errors.Join(os.Chown(path, was.uid, was.gid), os.Chmod(path, was.mode), os.Chtimes(path, was.mtime, was.mtime))
}

// userProcesses lists the processes that run as the user or its
// subordinate IDs.
func userProcesses(u *testUser) []int {
	if u == nil {
		return nil
	}
	return testhost.Processes(func(pid int, _ func(string) []byte) bool { return u.runs(pid) })
}
