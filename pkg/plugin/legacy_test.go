package plugin

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

// An ipam.dataDir that names the plugin's dataDir through a link (Nomad's
// "/var/run/cni" with "dataDir": "/run/cni", /var/run a link to /run) is
// no legacy directory: nothing is migrated from it. Before, once the
// network had leases, every ADD took host-local's lock through each name,
// waited on itself until the lock's timeout, and failed (code 5, "failed
// to migrate leases").
func TestAddWithIPAMDataDirNamingTheDataDirThroughALink(t *testing.T) {
	h := newHarness(t, "bridge")
	h.exec.reply["bridge ADD"] = bridgeResult100
	h.host.Namespaces["/var/run/netns/y"] = sysinfo.NetnsID{Dev: 4, Ino: 1001}
	old := ipamdir.LockTimeout
	ipamdir.LockTimeout = time.Second
	t.Cleanup(func() { ipamdir.LockTimeout = old })
	alias := filepath.Join(t.TempDir(), "var-run-cni")
	if err := os.Symlink(h.dataDir, alias); err != nil {
		t.Fatal(err)
	}
	h.served()
	conf := bytes.Replace(h.conf("1.0.0", ""), []byte(`"type":"host-local"`), []byte(`"type":"host-local","dataDir":"`+alias+`"`), 1)
	for _, a := range []struct{ cid, netns, lease string }{{"c1", "/var/run/netns/x", "172.26.64.2"}, {"c2", "/var/run/netns/y", "172.26.64.3"}} {
		args := h.args(conf)
		args.ContainerID, args.Netns = a.cid, a.netns
		if err := h.plugin.Funcs().Add(args); err != nil {
			t.Fatalf("ADD %s: %v", a.cid, err)
		}
		// The lease host-local wrote.
		if err := os.WriteFile(filepath.Join(h.dataDir, "nomad", a.lease), []byte(a.cid+"\r\neth0"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Contains(h.stderr.String(), "migrated") {
		t.Errorf("the dataDir was migrated onto itself: %s", h.stderr.String())
	}
}
