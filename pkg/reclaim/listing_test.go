package reclaim

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/fakehost"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/fakenat"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// listingChildEnv names the data dir in which this test binary, run again
// as a child, makes one re-ADD (TestReAddStopsWhenItsLeasesCannotBeListed).
const listingChildEnv = "NBC_RECLAIM_LISTING_CHILD"

// A re-ADD that releases the stale earlier attachment lists host-local's
// directory under its lock for the leases naming it; a listing that fails
// (getdents64: EIO, made by strace's fault injection, no code change)
// must stop the release before anything goes. Regression: the release
// went on with the leases it had read (none), removed the record and kept
// the lease, which then named a container no record names: unknown to
// every sweep, for the rest of the boot. Each getdents64 of the re-ADD in
// turn fails (K); after each, a lease that names the container must still
// have its record.
func TestReAddStopsWhenItsLeasesCannotBeListed(t *testing.T) {
	if dataDir := os.Getenv(listingChildEnv); dataDir != "" {
		listingChild(dataDir)
		return
	}
	strace, err := exec.LookPath("strace")
	if err != nil {
		testhost.SkipOrFail(t, "needs strace (scripts/deps.sh installs it)")
	}
	if out, err := exec.Command(strace, "-f", "-qq", "-o", "/dev/null", os.Args[0], "-test.run=^$").CombinedOutput(); err != nil {
		testhost.SkipOrFail(t, fmt.Sprintf("strace cannot trace here: %v\n%s", err, out))
	}
	key := records.Key{ContainerID: "c1", IfName: "eth0"}
	hit := false
	for k := 1; k <= 16; k++ {
		dataDir := tmpfsDir(t)
		w := &world{t: t, dataDir: dataDir, host: fakehost.New(bootTime)}
		if err := os.MkdirAll(filepath.Join(dataDir, net1), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dataDir, net1, "lock"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		w.lease("10.0.0.2", "c1\r\neth0", bootTime.Add(-time.Hour))
		w.record(&records.Record{ContainerID: "c1", IfName: "eth0", Netns: "/run/netns/c1", BootID: "an-earlier-boot", State: records.Complete, IPs: []string{"10.0.0.2/24"}})

		cmd := exec.Command(strace, "-f", "-qq", "-o", "/dev/null", "-e", "trace=getdents64", "-e", "inject=getdents64:error=EIO:when="+strconv.Itoa(k),
			os.Args[0], "-test.run=^TestReAddStopsWhenItsLeasesCannotBeListed$", "-test.count=1")
		cmd.Env = append(os.Environ(), listingChildEnv+"="+dataDir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("K=%d: the re-ADD under strace: %v\n%s", k, err, out)
		}
		if strings.Contains(string(out), "BeginAdd: <nil>") {
			continue // the injection missed the release
		}
		hit = true
		rec, rerr := records.NewStore(w.dir()).Read(key)
		if _, err := os.Stat(filepath.Join(dataDir, net1, "10.0.0.2")); err == nil && (rec == nil || rerr != nil) {
			t.Errorf("K=%d: the lease of %s stayed, its record did not (%v); the re-ADD said:\n%s", k, key, rerr, out)
		}
	}
	if !hit {
		t.Fatal("no injected getdents64 error made the re-ADD fail")
	}
}

// listingChild re-ADDs c1/eth0 in a new namespace at the same path, its
// record from an earlier boot, with a fake host and NAT tables: the
// getdents64 calls of the plugin's code are all this thread's.
func listingChild(dataDir string) {
	runtime.LockOSThread()
	host := fakehost.New(bootTime)
	host.Namespaces["/run/netns/c1"] = sysinfo.NetnsID{Dev: 4, Ino: 77}
	env := Env{Host: host, Netfilter: &netfilter.Cleaner{Tables: []netfilter.Table{fakenat.New()}}, Log: os.Stdout}
	_, err := (&Attacher{Env: env}).BeginAdd(ipamdir.New(dataDir, net1), records.Key{ContainerID: "c1", IfName: "eth0"}, "/run/netns/c1")
	fmt.Printf("BeginAdd: %v\n", err)
}
