package metrics

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/operator"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/fakehost"
)

// A network with a live attachment, a stale one, a record-less lease from
// this boot and three damaged records; its last CHECK sweep 90 s ago. The
// output parses with Prometheus's own text parser and says exactly that.
func TestMetricsParseAndCount(t *testing.T) {
	boot := time.Unix(1764576000, 0)
	host := fakehost.New(boot)
	dataDir := t.TempDir()
	d := ipamdir.New(dataDir, "web")
	if err := os.MkdirAll(d.Leases(), 0o755); err != nil {
		t.Fatal(err)
	}
	lease := func(ip, content string) {
		p := filepath.Join(d.Leases(), ip)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		mt := boot.Add(time.Minute)
		if err := os.Chtimes(p, mt, mt); err != nil {
			t.Fatal(err)
		}
	}
	store := records.NewStore(d)
	host.Namespaces["/run/netns/live"] = sysinfo.NetnsID{Dev: 4, Ino: 7}
	for _, r := range []*records.Record{
		{ContainerID: "live", Netns: "/run/netns/live", NetnsID: sysinfo.NetnsID{Dev: 4, Ino: 7}, BootID: host.ID},
		{ContainerID: "dead", Netns: "/run/netns/dead", NetnsID: sysinfo.NetnsID{Dev: 4, Ino: 8}, BootID: "boot-0"},
	} {
		r.Version, r.Network, r.IfName, r.State, r.Created = records.FormatVersion, "web", "eth0", records.Complete, boot
		if err := store.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	lease("10.0.0.2", "live\r\neth0")
	lease("10.0.0.3", "dead\r\neth0")
	lease("10.0.0.4", "someone\r\neth0")
	// Damaged or planted: skipped, counted, never held (there may be
	// 100 000 of them).
	for i := range 3 {
		if err := os.WriteFile(filepath.Join(dataDir, ipamdir.RecordDirName, "web", fmt.Sprintf("planted-%d@eth0", i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := &reclaim.Sweeper{Env: reclaim.Env{Host: host}}
	// A CHECK's sweep ended now (the marker sweeps write).
	if err := os.WriteFile(d.Marker(ipamdir.LastSweepMarker), []byte(fmt.Sprintf("%s %d", host.ID, host.Clock.UnixNano())), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.Marker(ipamdir.ReleasesMarker), []byte(`{"earlier-boot":4,"namespace-gone":2,"firewall-rules-kept":1,"refused-live-namespace":3}`), 0o600); err != nil {
		t.Fatal(err)
	}
	host.Clock = host.Clock.Add(90 * time.Second)

	nets, err := Collect(s, operator.Scope{DataDir: dataDir, Dirs: []ipamdir.Dir{ipamdir.New(dataDir, "web")}}, map[string]float64{"web": 254})
	if err != nil {
		t.Fatal(err)
	}
	out := bytes.NewBuffer(Text(nets))
	// The strict (legacy) name rules: what every Prometheus accepts.
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(out.Bytes()))
	if err != nil {
		t.Fatalf("Prometheus cannot parse it: %v\n%s", err, out.String())
	}
	value := func(name string, labels map[string]string) float64 {
		t.Helper()
		f, ok := families["nomad_bridge_cni_"+name]
		if !ok {
			t.Fatalf("no %s in\n%s", name, out.String())
		}
	next:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
		t.Fatalf("no %s%v in\n%s", name, labels, out.String())
		return 0
	}
	for _, c := range []struct {
		got, want float64
	}{
		{value("attachments", map[string]string{"network": "web", "state": "live"}), 1},
		{value("attachments", map[string]string{"network": "web", "state": "stale"}), 1},
		{value("attachments", map[string]string{"network": "web", "state": "unknown"}), 1},
		{value("attachments", map[string]string{"network": "web", "state": "detached"}), 0},
		{value("leases", map[string]string{"network": "web"}), 3},
		{value("range_addresses", map[string]string{"network": "web"}), 254},
		{value("orphan_nat_rule_sets", map[string]string{"network": "web"}), 0},
		{value("skipped_files", map[string]string{"network": "web"}), 3},
		{value("last_check_sweep_age_seconds", map[string]string{"network": "web"}), 90},
		{value("releases_total", map[string]string{"network": "web", "reason": "earlier-boot"}), 4},
		{value("releases_total", map[string]string{"network": "web", "reason": "namespace-gone"}), 2},
		{value("firewall_rules_kept_total", map[string]string{"network": "web"}), 1},
		{value("add_refusals_total", map[string]string{"network": "web", "reason": "live-namespace"}), 3},
		// t.TempDir is wherever TMPDIR is: compare with statfs's answer.
		{value("data_dir_tmpfs", map[string]string{"network": "web", "data_dir": dataDir}), map[bool]float64{true: 1}[onTmpfs(t, d)]},
	} {
		if c.got != c.want {
			t.Errorf("got %g, want %g\n%s", c.got, c.want, out.String())
		}
	}
	for _, m := range families["nomad_bridge_cni_releases_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "reason" && (l.GetValue() == reclaim.RefusedLiveCount || l.GetValue() == reclaim.ForwardKeptCount) {
				t.Errorf("releases_total counts %s, which is no release", l.GetValue())
			}
		}
	}
	for _, f := range families {
		want := "GAUGE"
		if strings.HasSuffix(f.GetName(), "_total") {
			want = "COUNTER"
		}
		if f.GetType().String() != want {
			t.Errorf("%s is %s, want %s", f.GetName(), f.GetType(), want)
		}
	}
}

func onTmpfs(t *testing.T, d ipamdir.Dir) bool {
	t.Helper()
	mem, _, err := d.OnTmpfs()
	if err != nil {
		t.Fatal(err)
	}
	return mem
}

// A data dir is any path: its label is escaped as the text format
// escapes (backslash, quote, newline; Go's %q escapes more, which
// Prometheus refuses, and drops the whole file), made valid UTF-8.
func TestDataDirLabelIsEscapedForPrometheus(t *testing.T) {
	dataDir := "/srv/a\tb\"c\\d\ne\xff"
	out := Text([]Network{{Name: "web", Attachments: map[reclaim.State]int{}, LastSweepAge: -1, DataDir: dataDir, TmpfsKnown: true}})
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(out))
	if err != nil {
		t.Fatalf("Prometheus cannot parse it: %v\n%s", err, out)
	}
	var got []string
	for _, m := range families["nomad_bridge_cni_data_dir_tmpfs"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "data_dir" {
				got = append(got, l.GetValue())
			}
		}
	}
	if want := strings.ToValidUTF8(dataDir, "\uFFFD"); len(got) != 1 || got[0] != want {
		t.Errorf("data_dir labels %q, want %q", got, want)
	}
}
