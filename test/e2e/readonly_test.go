package e2e

import (
	"testing"
)

// TestDelOnAReadOnlyDataDir: regression test. A DEL on a read-only data
// dir with nothing to delete failed with code 999 (`mkdir …: read-only
// file system`: host-local's DEL creates its directory first). Nothing to
// delete is a success; a DEL that has something to delete there still
// fails, and succeeds once the data dir is writable again.
func TestDelOnAReadOnlyDataDir(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	e.writeConflist(t, e.reclaimConf(t, "minimal.conflist"))
	held, never := e.addNetns(t, "held"), e.addNetns(t, "never")
	e.mustCNI(t, "add", held, "")
	remount := func(mode string) {
		t.Helper()
		if err := run("mount", "-o", "remount,"+mode, e.dataDir); err != nil {
			t.Fatalf("remount %s %s: %v", mode, e.dataDir, err)
		}
	}
	remount("ro")
	t.Cleanup(func() { _ = run("mount", "-o", "remount,rw", e.dataDir) })

	if _, stderr, err := e.cnitool("del", never, ""); err != nil {
		t.Errorf("DEL of a container the read-only data dir holds nothing of: %v\nstderr: %s", err, stderr)
	}
	if _, _, err := e.cnitool("del", held, ""); err == nil {
		t.Error("DEL of a container whose lease and record are on the read-only data dir succeeded: they are still there")
	}
	remount("rw")
	e.mustCNI(t, "del", held, "")
	e.assertNetworkEmpty(t, e.leaseDir())
}
