package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
)

// Hostile input. The plugin binary is run directly, as a
// runtime runs it (CNI_* environment, config on stdin), with inputs a
// runtime, a conflist author or an attacker could hand it. Each must end in
// a single CNI error object on stdout with the code the contract gives it,
// a non-zero exit and no panic, and must change nothing: not the test's
// dataDir (a tmpfs), not its legacy lease directory, not the working
// directory, not /var/lib/cni/networks or /var/run/cni, no link, and not a
// rule of the nat or filter tables. The plugin runs in a network namespace
// of its own standing in for the host's, where the link list and the full
// nat and filter dumps of both families are compared line for line (other
// test runs may share the real host, which is checked for any line naming
// the test's network, bridge, subnets or container).

// hostileCase is one input. stdin builds the config from a valid entry;
// env overrides the CNI environment (a value of envUnset removes the variable).
type hostileCase struct {
	name    string
	command string // default ADD
	env     func(e *testEnv, ns, hostNS netns) map[string]string
	stdin   func(t *testing.T, e *testEnv) []byte
	// setup runs before the snapshot, in the run's working directory;
	// hostSetup then, in the namespace standing in for the host's.
	setup     func(t *testing.T, e *testEnv, cwd string)
	hostSetup func(t *testing.T, hostNS netns)
	codes     []int
	// msg, when set, must appear in the error's msg or details.
	msg string
}

const envUnset = "\x00unset"

// CNI error codes the contract pins.
const (
	codeIncompatibleVersion = 1
	codeInvalidEnv          = 4
	codeIOFailure           = 5
	codeDecoding            = 6
	codeInvalidConfig       = 7
	codeInvalidNetNS        = 8
	codeTryAgainLater       = 11
	codeInternal            = 999
)

// hostileEntry is the minimal example's plugin entry for the test's network
// as a runtime passes it (name and cniVersion included), with ipam.dataDir
// set to the test's own legacy directory so that nothing ever looks at the
// real /var/lib/cni/networks. Each call returns a fresh copy.
func hostileEntry(t *testing.T, e *testEnv, cniVersion string) map[string]any {
	t.Helper()
	conf := e.reclaimConf(t, "minimal.conflist")
	if cniVersion != "" {
		conf["cniVersion"] = cniVersion
	}
	var entry map[string]any
	if err := json.Unmarshal(entryConfig(t, conf, pluginType), &entry); err != nil {
		t.Fatalf("decode entry: %v", err)
	}
	return entry
}

// entryWith builds stdin from the valid entry changed by edit.
func entryWith(cniVersion string, edit func(e *testEnv, c map[string]any)) func(*testing.T, *testEnv) []byte {
	return func(t *testing.T, e *testEnv) []byte {
		c := hostileEntry(t, e, cniVersion)
		edit(e, c)
		return mustJSON(t, c)
	}
}

// set returns stdin with key (a dotted path for ipam.*) set to v.
func cfgSet(key string, v any) func(*testing.T, *testEnv) []byte {
	return entryWith("", func(e *testEnv, c map[string]any) { setEntryKey(c, key, v) })
}

func setEntryKey(c map[string]any, key string, v any) {
	if sub, ok := strings.CutPrefix(key, "ipam."); ok {
		c["ipam"].(map[string]any)[sub] = v
		return
	}
	c[key] = v
}

// del returns stdin with key removed.
func cfgDel(key string) func(*testing.T, *testEnv) []byte {
	return entryWith("", func(e *testEnv, c map[string]any) {
		if sub, ok := strings.CutPrefix(key, "ipam."); ok {
			delete(c["ipam"].(map[string]any), sub)
			return
		}
		delete(c, key)
	})
}

// raw returns stdin as given.
func rawStdin(s string) func(*testing.T, *testEnv) []byte {
	return func(*testing.T, *testEnv) []byte { return []byte(s) }
}

// gcConfigWith is a GC config (cniVersion 1.1.0) with the given valid list, raw.
func gcConfigWith(key, list string) func(*testing.T, *testEnv) []byte {
	return func(t *testing.T, e *testEnv) []byte {
		c := hostileEntry(t, e, "1.1.0")
		c[key] = json.RawMessage(list)
		return mustJSON(t, c)
	}
}

// envWith overrides one CNI variable.
func envWith(k, v string) func(*testEnv, netns, netns) map[string]string {
	return func(*testEnv, netns, netns) map[string]string { return map[string]string{k: v} }
}

// entryPaddedTo pads the valid entry with an unknown key to exactly size bytes.
func entryPaddedTo(size int, edit func(c map[string]any)) func(*testing.T, *testEnv) []byte {
	return func(t *testing.T, e *testEnv) []byte {
		c := hostileEntry(t, e, "")
		edit(c)
		c["padding"] = ""
		n := size - len(mustJSON(t, c))
		if n < 0 {
			t.Fatalf("entry is already larger than %d bytes", size)
		}
		c["padding"] = strings.Repeat("x", n)
		out := mustJSON(t, c)
		if len(out) != size {
			t.Fatalf("padded entry is %d bytes, want %d", len(out), size)
		}
		return out
	}
}

func hostileCases() []hostileCase {
	const mib = 1 << 20
	return []hostileCase{
		// Not JSON, or not a JSON object.
		{name: "stdin-empty", stdin: rawStdin(""), codes: []int{codeDecoding}},
		{name: "json-truncated", codes: []int{codeDecoding}, stdin: func(t *testing.T, e *testEnv) []byte {
			b := mustJSON(t, hostileEntry(t, e, ""))
			return b[:len(b)/2]
		}},
		{name: "garbage-bytes", stdin: rawStdin("\xff\xfe\x00\x01garbage{{"), codes: []int{codeDecoding}},
		{name: "json-array", stdin: rawStdin(`[{"name":"x"}]`), codes: []int{codeDecoding}},
		{name: "json-string", stdin: rawStdin(`"hello"`), codes: []int{codeDecoding}},
		{name: "json-number", stdin: rawStdin(`42`), codes: []int{codeDecoding}},
		// Regression: skel read null as an empty config (code 7).
		{name: "json-null", stdin: rawStdin(`null`), codes: []int{codeDecoding}},
		{name: "json-null-DEL", command: "DEL", stdin: rawStdin(` null `), codes: []int{codeDecoding}},
		{name: "json-trailing-garbage", codes: []int{codeDecoding}, stdin: func(t *testing.T, e *testEnv) []byte {
			return append(mustJSON(t, hostileEntry(t, e, "")), "}{"...)
		}},
		{name: "json-nested-200k-deep", codes: []int{codeDecoding}, stdin: func(t *testing.T, e *testEnv) []byte {
			return []byte(`{"cniVersion":"1.0.0","name":"` + e.netName + `","deep":` + strings.Repeat("[", 200000) + strings.Repeat("]", 200000) + `}`)
		}},
		{name: "stdin-over-1MiB", stdin: entryPaddedTo(mib+1, func(map[string]any) {}), codes: []int{codeDecoding}, msg: "larger than 1048576 bytes"},
		{name: "stdin-64MiB-garbage", stdin: rawStdin(strings.Repeat("x", 64*mib)), codes: []int{codeDecoding}, msg: "larger than 1048576 bytes"},
		// Exactly at the cap the config is read and parsed in full: the
		// delegate it names is what gets it rejected.
		{name: "stdin-exactly-1MiB-is-parsed", codes: []int{codeInvalidConfig}, msg: "no-such-plugin",
			stdin: entryPaddedTo(mib, func(c map[string]any) { c["delegate"] = "no-such-plugin" })},

		// Wrong JSON types for every key the plugin (or skel) reads.
		{name: "name-number", stdin: cfgSet("name", 42), codes: []int{codeDecoding}},
		{name: "name-object", stdin: cfgSet("name", map[string]any{"a": 1}), codes: []int{codeDecoding}},
		{name: "name-null", stdin: cfgSet("name", nil), codes: []int{codeInvalidConfig}},
		{name: "cniVersion-number", stdin: cfgSet("cniVersion", 1.0), codes: []int{codeDecoding}},
		{name: "cniVersion-array", stdin: cfgSet("cniVersion", []any{"1.0.0"}), codes: []int{codeDecoding}},
		{name: "type-number", stdin: cfgSet("type", 7), codes: []int{codeInvalidConfig}},
		{name: "type-object", stdin: cfgSet("type", map[string]any{}), codes: []int{codeInvalidConfig}},
		{name: "delegate-number", stdin: cfgSet("delegate", 1), codes: []int{codeInvalidConfig}},
		{name: "delegate-array", stdin: cfgSet("delegate", []any{"bridge"}), codes: []int{codeInvalidConfig}},
		{name: "delegate-object", stdin: cfgSet("delegate", map[string]any{"type": "bridge"}), codes: []int{codeInvalidConfig}},
		{name: "dataDir-number", stdin: cfgSet("dataDir", 0), codes: []int{codeInvalidConfig}},
		{name: "dataDir-bool", stdin: cfgSet("dataDir", true), codes: []int{codeInvalidConfig}},
		{name: "dataDir-array", stdin: cfgSet("dataDir", []any{"/run/cni"}), codes: []int{codeInvalidConfig}},
		{name: "delegateTimeout-number", stdin: cfgSet("delegateTimeout", 5), codes: []int{codeInvalidConfig}},
		{name: "delegateTimeout-object", stdin: cfgSet("delegateTimeout", map[string]any{"s": 5}), codes: []int{codeInvalidConfig}},
		{name: "ipam-string", stdin: cfgSet("ipam", "host-local"), codes: []int{codeInvalidConfig}},
		{name: "ipam-array", stdin: cfgSet("ipam", []any{map[string]any{"type": "host-local"}}), codes: []int{codeInvalidConfig}},
		{name: "ipam-number", stdin: cfgSet("ipam", 3), codes: []int{codeInvalidConfig}},
		{name: "ipam-null", stdin: cfgSet("ipam", nil), codes: []int{codeInvalidConfig}},
		{name: "ipam-missing", stdin: cfgDel("ipam"), codes: []int{codeInvalidConfig}},
		{name: "ipam.type-number", stdin: cfgSet("ipam.type", 1), codes: []int{codeInvalidConfig}},
		{name: "ipam.type-missing", stdin: cfgDel("ipam.type"), codes: []int{codeInvalidConfig}},
		{name: "ipam.type-static", stdin: cfgSet("ipam.type", "static"), codes: []int{codeInvalidConfig}},
		{name: "ipam.type-dhcp", stdin: cfgSet("ipam.type", "dhcp"), codes: []int{codeInvalidConfig}},
		{name: "ipam.dataDir-number", stdin: cfgSet("ipam.dataDir", 17), codes: []int{codeInvalidConfig}},
		{name: "ipam.dataDir-object", stdin: cfgSet("ipam.dataDir", map[string]any{}), codes: []int{codeInvalidConfig}},

		// cniVersion.
		{name: "cniVersion-unknown", stdin: cfgSet("cniVersion", "99.0.0"), codes: []int{codeIncompatibleVersion}},
		{name: "cniVersion-garbage", stdin: cfgSet("cniVersion", "one point oh"), codes: []int{codeIncompatibleVersion}},
		// Was reported as config version "0.1.0".
		{name: "cniVersion-empty", stdin: cfgSet("cniVersion", ""), codes: []int{codeIncompatibleVersion}, msg: `"cniVersion" is empty`},
		{name: "cniVersion-0.1.0", stdin: cfgSet("cniVersion", "0.1.0"), codes: []int{codeIncompatibleVersion}},
		{name: "CHECK-cniVersion-0.3.1", command: "CHECK", stdin: cfgSet("cniVersion", "0.3.1"), codes: []int{codeIncompatibleVersion}},
		{name: "GC-cniVersion-1.0.0", command: "GC", stdin: cfgSet("cniVersion", "1.0.0"), codes: []int{codeIncompatibleVersion}},

		// Network names that are paths, or not names.
		{name: "name-slash", stdin: cfgSet("name", "a/b"), codes: []int{codeInvalidConfig}},
		{name: "name-dotdot", stdin: cfgSet("name", ".."), codes: []int{codeInvalidConfig}},
		{name: "name-dot", stdin: cfgSet("name", "."), codes: []int{codeInvalidConfig}},
		{name: "name-traversal", stdin: cfgSet("name", "../../../etc"), codes: []int{codeInvalidConfig}},
		{name: "name-NUL", stdin: cfgSet("name", "net\x00work"), codes: []int{codeInvalidConfig}},
		{name: "name-newline", stdin: cfgSet("name", "net\nwork"), codes: []int{codeInvalidConfig}},
		{name: "name-empty", stdin: cfgSet("name", ""), codes: []int{codeInvalidConfig}},
		{name: "name-leading-dash", stdin: cfgSet("name", "-net"), codes: []int{codeInvalidConfig}},
		{name: "name-is-records-dir", stdin: cfgSet("name", ".nomad-bridge-cni"), codes: []int{codeInvalidConfig}},
		// Valid for the skel regex but too long for a directory name: the
		// plugin's directory check fails before anything is created.
		// Was code 5, "unsafe data directory ... file name too long".
		{name: "name-300-bytes", stdin: cfgSet("name", "n"+strings.Repeat("x", 299)), codes: []int{codeInvalidConfig}, msg: "more than the 255"},

		// The CNI environment.
		{name: "containerid-slash", env: envWith("CNI_CONTAINERID", "a/b"), codes: []int{codeInvalidEnv}},
		{name: "containerid-traversal", env: envWith("CNI_CONTAINERID", "../../etc"), codes: []int{codeInvalidEnv}},
		{name: "containerid-at", env: envWith("CNI_CONTAINERID", "abc@eth1"), codes: []int{codeInvalidEnv}},
		{name: "containerid-newline", env: envWith("CNI_CONTAINERID", "abc\ndef"), codes: []int{codeInvalidEnv}},
		{name: "containerid-space", env: envWith("CNI_CONTAINERID", "abc def"), codes: []int{codeInvalidEnv}},
		{name: "containerid-leading-dot", env: envWith("CNI_CONTAINERID", ".abc"), codes: []int{codeInvalidEnv}},
		{name: "containerid-empty", env: envWith("CNI_CONTAINERID", ""), codes: []int{codeInvalidEnv}},
		{name: "containerid-envUnset-DEL", command: "DEL", env: envWith("CNI_CONTAINERID", envUnset), codes: []int{codeInvalidEnv}},
		{name: "ifname-16-bytes", env: envWith("CNI_IFNAME", "eth0123456789abc"), codes: []int{codeInvalidEnv}},
		{name: "ifname-64-bytes", env: envWith("CNI_IFNAME", strings.Repeat("e", 64)), codes: []int{codeInvalidEnv}},
		{name: "ifname-slash", env: envWith("CNI_IFNAME", "eth/0"), codes: []int{codeInvalidEnv}},
		{name: "ifname-dotdot", env: envWith("CNI_IFNAME", ".."), codes: []int{codeInvalidEnv}},
		{name: "ifname-dot", env: envWith("CNI_IFNAME", "."), codes: []int{codeInvalidEnv}},
		{name: "ifname-colon", env: envWith("CNI_IFNAME", "eth:0"), codes: []int{codeInvalidEnv}},
		{name: "ifname-space", env: envWith("CNI_IFNAME", "eth 0"), codes: []int{codeInvalidEnv}},
		{name: "ifname-empty", env: envWith("CNI_IFNAME", ""), codes: []int{codeInvalidEnv}},
		{name: "command-unknown", env: envWith("CNI_COMMAND", "EXPLODE"), codes: []int{codeInvalidEnv}},
		{name: "CNI_PATH-empty", env: envWith("CNI_PATH", ""), codes: []int{codeInvalidEnv}},
		{name: "CNI_NETNS-envUnset", env: envWith("CNI_NETNS", envUnset), codes: []int{codeInvalidEnv}},

		// dataDir.
		{name: "dataDir-relative", stdin: cfgSet("dataDir", "relative/leases"), codes: []int{codeInvalidConfig}},
		{name: "dataDir-dot-relative", stdin: cfgSet("dataDir", "./leases"), codes: []int{codeInvalidConfig}},
		{name: "dataDir-empty", stdin: cfgSet("dataDir", ""), codes: []int{codeInvalidConfig}},
		{name: "dataDir-dotdot", codes: []int{codeInvalidConfig}, stdin: entryWith("", func(e *testEnv, c map[string]any) {
			c["dataDir"] = e.dataDir + "/../escape"
		})},
		{name: "dataDir-trailing-dotdot", codes: []int{codeInvalidConfig}, stdin: entryWith("", func(e *testEnv, c map[string]any) {
			c["dataDir"] = e.dataDir + "/.."
		})},
		{name: "dataDir-NUL", codes: []int{codeInvalidConfig}, stdin: entryWith("", func(e *testEnv, c map[string]any) {
			c["dataDir"] = e.dataDir + "\x00/x"
		})},
		{name: "DEL-dataDir-relative", command: "DEL", stdin: cfgSet("dataDir", "relative"), codes: []int{codeInvalidConfig}},

		// delegate.
		{name: "delegate-relative-path", stdin: cfgSet("delegate", "../bin/bridge"), codes: []int{codeInvalidConfig}},
		{name: "delegate-absolute-path", codes: []int{codeInvalidConfig}, stdin: entryWith("", func(e *testEnv, c map[string]any) {
			c["delegate"] = filepath.Join(e.bin, "bridge")
		})},
		{name: "delegate-dotdot", stdin: cfgSet("delegate", ".."), codes: []int{codeInvalidConfig}},
		{name: "delegate-dot", stdin: cfgSet("delegate", "."), codes: []int{codeInvalidConfig}},
		{name: "delegate-backslash", stdin: cfgSet("delegate", `..\bridge`), codes: []int{codeInvalidConfig}},
		{name: "delegate-NUL", stdin: cfgSet("delegate", "bridge\x00x"), codes: []int{codeInvalidConfig}},
		{name: "delegate-newline", stdin: cfgSet("delegate", "bridge\n"), codes: []int{codeInvalidConfig}},
		{name: "delegate-empty", stdin: cfgSet("delegate", ""), codes: []int{codeInvalidConfig}},
		{name: "delegate-self", stdin: cfgSet("delegate", pluginType), codes: []int{codeInvalidConfig}},
		{name: "delegate-not-in-CNI_PATH", stdin: cfgSet("delegate", "no-such-plugin"), codes: []int{codeInvalidConfig}, msg: "no-such-plugin"},
		{name: "CHECK-delegate-path", command: "CHECK", stdin: cfgSet("delegate", "/bin/sh"), codes: []int{codeInvalidConfig}},
		{name: "STATUS-delegate-path", command: "STATUS", codes: []int{codeInvalidConfig},
			stdin: entryWith("1.1.0", func(e *testEnv, c map[string]any) { c["delegate"] = "/bin/sh" })},

		// delegateTimeout.
		{name: "delegateTimeout-garbage", stdin: cfgSet("delegateTimeout", "forever"), codes: []int{codeInvalidConfig}},
		{name: "delegateTimeout-negative", stdin: cfgSet("delegateTimeout", "-1s"), codes: []int{codeInvalidConfig}},
		{name: "delegateTimeout-zero", stdin: cfgSet("delegateTimeout", "0s"), codes: []int{codeInvalidConfig}},
		{name: "delegateTimeout-over-1h", stdin: cfgSet("delegateTimeout", "61m"), codes: []int{codeInvalidConfig}},
		{name: "delegateTimeout-no-unit", stdin: cfgSet("delegateTimeout", "1000000000"), codes: []int{codeInvalidConfig}},

		// GC with garbage in the list of valid attachments.
		{name: "GC-valid-string", command: "GC", stdin: gcConfigWith("cni.dev/valid-attachments", `"all"`), codes: []int{codeInvalidConfig}},
		{name: "GC-valid-object", command: "GC", stdin: gcConfigWith("cni.dev/valid-attachments", `{"containerID":"a","ifname":"eth0"}`), codes: []int{codeInvalidConfig}},
		{name: "GC-valid-numbers", command: "GC", stdin: gcConfigWith("cni.dev/valid-attachments", `[1,2,3]`), codes: []int{codeInvalidConfig}},
		{name: "GC-valid-null-entry", command: "GC", stdin: gcConfigWith("cni.dev/valid-attachments", `[null]`), codes: []int{codeInvalidConfig}},
		{name: "GC-valid-wrong-field-types", command: "GC", stdin: gcConfigWith("cni.dev/valid-attachments", `[{"containerID":5,"ifname":true}]`), codes: []int{codeInvalidConfig}},
		{name: "GC-valid-containerid-slash", command: "GC", stdin: gcConfigWith("cni.dev/valid-attachments", `[{"containerID":"../../etc","ifname":"eth0"}]`), codes: []int{codeInvalidConfig}},
		{name: "GC-valid-containerid-empty", command: "GC", stdin: gcConfigWith("cni.dev/valid-attachments", `[{"containerID":"","ifname":"eth0"}]`), codes: []int{codeInvalidConfig}},
		{name: "GC-valid-containerid-NUL", command: "GC", stdin: gcConfigWith("cni.dev/valid-attachments", `[{"containerID":"a\u0000b","ifname":"eth0"}]`), codes: []int{codeInvalidConfig}},
		{name: "GC-valid-ifname-too-long", command: "GC", stdin: gcConfigWith("cni.dev/valid-attachments", `[{"containerID":"abc","ifname":"eth0123456789abcdef"}]`), codes: []int{codeInvalidConfig}},
		{name: "GC-valid-ifname-slash", command: "GC", stdin: gcConfigWith("cni.dev/valid-attachments", `[{"containerID":"abc","ifname":"../x"}]`), codes: []int{codeInvalidConfig}},
		{name: "GC-valid-one-good-one-bad", command: "GC", codes: []int{codeInvalidConfig},
			stdin: gcConfigWith("cni.dev/valid-attachments", `[{"containerID":"good","ifname":"eth0"},{"containerID":"bad id","ifname":"eth0"}]`)},
		{name: "GC-old-key-garbage", command: "GC", stdin: gcConfigWith("cni.dev/attachments", `"garbage"`), codes: []int{codeInvalidConfig}},
	}
}

// TestHostileInput runs every hostile case on a fresh environment.
func TestHostileInput(t *testing.T) {
	cases := hostileCases()
	if len(cases) < 40 {
		t.Fatalf("only %d hostile cases, the contract is at least 40", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { runHostileCase(t, tc) })
	}
}

// TestHostileInputBeforeAnyWrite holds the hostile inputs the plugin once
// mishandled; each case is the regression test of its fix. What went wrong
// before:
//
//   - ADD and CHECK wrote dataDir/.nomad-bridge-cni/<net>/.migrated (and CHECK
//     also <net>/lock) before the input was fully validated: a netns that
//     is missing or not a namespace, a container ID too long for a record
//     file name, and a prevResult that is not a result were only found
//     afterwards (or by the delegate).
//   - ipam.dataDir (the legacy lease directory, which migration reads and
//     deletes from) was not validated like dataDir: a relative path resolved
//     against the runtime's working directory, where the plugin then
//     created <dir>/<net>/lock and deleted leases from before this boot.
//   - CNI_NETNS naming the plugin's own namespace reached the delegate:
//     bridge then configured the host's namespace, and upstream skel only
//     rejects it after the ADD has run, printing a result and an error; the
//     plugin read that as a code-0 error and kept the lease, the bridge
//     and the veth.
func TestHostileInputBeforeAnyWrite(t *testing.T) {
	prev := func(pr any) func(*testing.T, *testEnv) []byte {
		return entryWith("", func(e *testEnv, c map[string]any) { c["prevResult"] = pr })
	}
	for _, tc := range []hostileCase{
		// Today: code 999 from bridge, and .migrated + <net>/lock created.
		{name: "CHECK-prevResult-string", command: "CHECK", stdin: prev("garbage"), codes: []int{codeDecoding}},
		{name: "CHECK-prevResult-number", command: "CHECK", stdin: prev(42), codes: []int{codeDecoding}},
		{name: "CHECK-prevResult-array", command: "CHECK", stdin: prev([]any{1, 2}), codes: []int{codeDecoding}},
		// Today: code 999 ("Failed to find address"), files created.
		{name: "CHECK-prevResult-ips-not-a-list", command: "CHECK", stdin: prev(map[string]any{"cniVersion": "1.0.0", "ips": "10.0.0.2/24"}), codes: []int{codeDecoding}},
		// A 0.2.0-shaped result (ip4) in a 1.0.0 config: libcni always
		// converts prevResult to the config's version, so this is not a
		// result of this version; 1 (version) or 6 (decoding) both fit.
		{name: "CHECK-prevResult-wrong-version", command: "CHECK", codes: []int{codeIncompatibleVersion, codeDecoding},
			stdin: prev(map[string]any{"cniVersion": "0.2.0", "ip4": map[string]any{"ip": "10.0.0.2/24"}})},
		// Today: code 999 from bridge after the pending record was written
		// and removed; .migrated created.
		{name: "ADD-prevResult-string", stdin: prev("garbage"), codes: []int{codeDecoding}},
		// Today: ADD succeeds; migration creates <cwd>/relative/<net>/lock
		// and deletes the lease from before this boot planted there.
		{name: "ipam.dataDir-relative", stdin: cfgSet("ipam.dataDir", "relative"), codes: []int{codeInvalidConfig},
			setup: func(t *testing.T, e *testEnv, cwd string) {
				writeLease(t, filepath.Join(cwd, "relative", e.netName), e.hostAddr(9), "old-container\r\neth0", bootTime(t).Add(-time.Hour))
			}},
		// Today: ADD succeeds.
		{name: "ipam.dataDir-dotdot", codes: []int{codeInvalidConfig}, stdin: entryWith("", func(e *testEnv, c map[string]any) {
			c["ipam"].(map[string]any)["dataDir"] = e.persistDir + "/../" + filepath.Base(e.persistDir)
		})},
		// Today: code 5 ("failed to write the attachment record ... file
		// name too long"), .migrated created.
		{name: "containerid-300-bytes", env: envWith("CNI_CONTAINERID", "c"+strings.Repeat("x", 299)), codes: []int{codeInvalidEnv}},
		// Today: code 8, .migrated created.
		{name: "CNI_NETNS-missing", env: envWith("CNI_NETNS", "/var/run/netns/nbc-e2e-does-not-exist"), codes: []int{codeInvalidNetNS}},
		{name: "CNI_NETNS-regular-file", env: envWith("CNI_NETNS", "/etc/hostname"), codes: []int{codeInvalidNetNS}},
		// Was accepted and recorded as given, then judged by a sweep
		// against its own working directory.
		{name: "CNI_NETNS-relative", codes: []int{codeInvalidEnv}, msg: "not an absolute path",
			env: func(e *testEnv, ns, hostNS netns) map[string]string {
				return map[string]string{"CNI_NETNS": strings.TrimPrefix(ns.path, "/")}
			}},
		// Today: code 0; bridge set up the plugin's own namespace: a lease
		// in dataDir, the bridge and a veth pair, no pending record.
		{name: "CNI_NETNS-is-the-plugins-own", codes: []int{codeInvalidNetNS},
			env: func(e *testEnv, ns, hostNS netns) map[string]string {
				return map[string]string{"CNI_NETNS": hostNS.path}
			}},
		// Today: code 8 from skel's check after the DEL, and the host's
		// link named CNI_IFNAME is gone: bridge deleted it.
		{name: "DEL-CNI_NETNS-is-the-plugins-own", command: "DEL", codes: []int{codeInvalidNetNS}, hostSetup: hostLink(ifName),
			env: func(e *testEnv, ns, hostNS netns) map[string]string {
				return map[string]string{"CNI_NETNS": hostNS.path}
			}},
		{name: "DEL-CNI_NETNS-is-proc-self", command: "DEL", codes: []int{codeInvalidNetNS}, hostSetup: hostLink(ifName),
			env: func(e *testEnv, ns, hostNS netns) map[string]string {
				return map[string]string{"CNI_NETNS": "/proc/self/ns/net"}
			}},
		{name: "CHECK-CNI_NETNS-is-the-plugins-own", command: "CHECK", codes: []int{codeInvalidNetNS}, hostSetup: hostLink(ifName),
			env: func(e *testEnv, ns, hostNS netns) map[string]string {
				return map[string]string{"CNI_NETNS": hostNS.path}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) { runHostileCase(t, tc) })
	}
}

// hostLink makes a link named name in the namespace standing in for the
// host's: what a DEL given the host's namespace must not delete.
func hostLink(name string) func(t *testing.T, hostNS netns) {
	return func(t *testing.T, hostNS netns) {
		t.Helper()
		if err := run("ip", "-n", hostNS.name, "link", "add", name, "type", "bridge"); err != nil {
			t.Fatalf("host link %s: %v", name, err)
		}
	}
}

// runHostileCase runs one case in a fresh environment and asserts the
// error and that nothing changed.
//
// The plugin runs in a namespace of its own (nsenter --net) that stands in
// for the host's: other test runs may share this host, and only there can
// the whole link list and the full nat and filter dumps be compared line
// for line. The host's real namespace is checked too, for any line naming
// the test's network, bridge, subnets or container.
func runHostileCase(t *testing.T, tc hostileCase) {
	t.Helper()
	e := newEnv(t)
	e.requirePlugin(t)
	requireTool(t, "nsenter")
	ns := e.addNetns(t, "a")
	hostNS := e.addNetns(t, "host")
	cwd := t.TempDir() // where a relative path would land
	command := tc.command
	if command == "" {
		command = "ADD"
	}
	var env []string
	if tc.env != nil {
		for k, v := range tc.env(e, ns, hostNS) {
			if v == envUnset {
				env = append(env, k)
			} else {
				env = append(env, k+"="+v)
			}
		}
	}
	var stdin []byte
	if tc.stdin != nil {
		stdin = tc.stdin(t, e)
	} else {
		stdin = mustJSON(t, hostileEntry(t, e, ""))
	}
	if tc.setup != nil {
		tc.setup(t, e, cwd)
	}
	if tc.hostSetup != nil {
		tc.hostSetup(t, hostNS)
	}

	scope := e.hostileScope(hostNS.path, e.dataDir, e.persistDir, cwd)
	before := takeHostState(t, scope)
	nsenter := []string{"--net=" + hostNS.path, "--", e.binary(pluginType)}
	r := cniexec.Run(t, "nsenter", e.cniArgs(command, ns), cniexec.Opts{Argv: nsenter, Stdin: stdin, Dir: cwd, Env: env})
	ce := assertCNIFailure(t, r, tc.codes...)
	if tc.msg != "" && !strings.Contains(ce.Msg+" "+ce.Details, tc.msg) {
		t.Errorf("error does not mention %q: msg %q details %q", tc.msg, ce.Msg, ce.Details)
	}
	t.Logf("code %d: %s (%s) in %v", ce.code(), truncateText(ce.Msg, 200), truncateText(ce.Details, 200), r.Elapsed.Round(time.Millisecond))
	before.assertUnchanged(t, takeHostState(t, scope))
	if linkExistsIn(ns, ifName) {
		t.Errorf("%s was created in %s", ifName, ns.name)
	}
}

// hostileScope is what a hostile run must leave as it was: the trees (the
// test's dataDir, legacy lease directory, the plugin's working
// directory...), the namespace the plugin ran in (none: "") and the test's
// footprint in the host's.
func (e *testEnv) hostileScope(pluginNS string, trees ...string) stateScope {
	e.mu.Lock()
	cids := slices.Clone(e.cids)
	e.mu.Unlock()
	footprint := append([]string{e.netName, e.bridge, e.id, e.subnet4.Addr().String(), e.subnet6.Addr().String()}, cids...)
	for _, cid := range cids {
		footprint = append(footprint, e.masqChain(cid), e.dnatChain(cid))
	}
	// The IPv4 subnet's first three octets mark addresses in it.
	a := e.subnet4.Addr().As4()
	footprint = append(footprint, fmt.Sprintf("%d.%d.%d.", a[0], a[1], a[2]))
	return stateScope{pluginNS: pluginNS, footprint: footprint, trees: trees}
}

func truncateText(s string, n int) string {
	if len(s) > n {
		return s[:n] + fmt.Sprintf("... (%d bytes)", len(s))
	}
	return s
}

// A DEL of a container ID the plugin never attached, naming the namespace
// and ifname of one it did (a runtime's stale cache, a script's typo):
// bridge deletes CNI_IFNAME in CNI_NETNS whoever it belongs to, so it must
// not be run. The DEL succeeds, as a DEL must, says why, and the live
// container keeps its interface, address, lease and NAT rules (regression:
// its eth0 was deleted).
func TestDelOfAnotherIDKeepsTheLiveInterface(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	e.writeConflist(t, e.reclaimConf(t, "nomad.conflist"))
	live := e.addNetns(t, "live")
	addr, gw := parseResult(t, e.mustCNI(t, "add", live, "")).addrIn(t, e.subnet4)

	args := e.cniArgs("DEL", live)
	args.ContainerID = "someoneelse-" + e.id
	r := cniexec.Run(t, e.binary(pluginType), args, cniexec.Opts{Stdin: mustJSON(t, hostileEntry(t, e, ""))})
	if r.ExitCode != 0 {
		t.Fatalf("DEL of an unknown ID: %v", r)
	}
	if !strings.Contains(r.Stderr, live.cid) || !strings.Contains(r.Stderr, "not run") {
		t.Errorf("the DEL does not say why bridge was not run: %q", r.Stderr)
	}
	assertAddrOnIf(t, live, addr)
	ping(t, live, gw)
	assertLease(t, e.leaseDir(), addr.Addr(), live.cid)
	e.assertRecord(t, live, addr.Addr())
	e.assertNAT(t, live.cid, natWant{Masq: []netip.Addr{addr.Addr()}})
	e.mustCNI(t, "check", live, "")
	e.mustCNI(t, "del", live, "")
	e.assertNetworkEmpty(t, e.leaseDir())
}

// A verb that fails on a network the plugin never served leaves nothing:
// not the data dir, not the marker that makes the network's NAT rules the
// plugin's, not host-local's directory or lock (regression: an ADD that only
// bridge refused left the data dir, .owned and .migrated; a failed CHECK
// left <net>/lock and the record directory). Run on a data dir that does
// not exist yet, on tmpfs and off it (where the not-on-tmpfs warning
// writes its marker).
func TestFailedVerbOnANewNetworkLeavesNothing(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	ns := e.addNetns(t, "c")
	for name, parent := range map[string]string{"tmpfs": e.dataDir, "disk": t.TempDir()} {
		t.Run(name, func(t *testing.T) {
			dataDir := filepath.Join(parent, "fresh")
			for _, tc := range []struct {
				command string
				edit    func(c map[string]any)
			}{
				{"ADD", func(c map[string]any) { c["hairpinMode"] = "yes" }},
				{"CHECK", func(c map[string]any) {
					c["prevResult"] = map[string]any{"cniVersion": c["cniVersion"], "ips": []any{map[string]any{"address": e.hostAddr(9).String() + "/24"}}}
				}},
				{"GC", func(c map[string]any) { c["cniVersion"] = "1.1.0" }},
			} {
				entry := hostileEntry(t, e, "")
				entry["dataDir"] = dataDir
				tc.edit(entry)
				args := e.cniArgs(tc.command, ns)
				r := cniexec.Run(t, e.binary(pluginType), args, cniexec.Opts{Stdin: mustJSON(t, entry)})
				if tc.command != "GC" && r.ExitCode == 0 {
					t.Errorf("%s passed: %v", tc.command, r)
				}
				if _, err := os.Lstat(dataDir); !os.IsNotExist(err) {
					entries, _ := os.ReadDir(dataDir)
					t.Errorf("%s (%v) left %s with %v", tc.command, r.Stderr, dataDir, entries)
					os.RemoveAll(dataDir)
				}
			}
		})
	}
}
