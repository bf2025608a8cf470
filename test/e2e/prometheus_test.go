package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// TestPrometheusAlerts: the shipped alerting rules on a real Prometheus
// and node_exporter (Debian's), each started by the test on a loopback
// port of its own with its own data dir, scraping the textfile the
// plugin's `metrics` writes as its timer does, for a real network through
// the plugin. Healthy, no alert fires; a container that dies without a
// DEL fires the stale-attachment alert, and `gc` resolves it; a range
// filled to under 5 free addresses fires the exhaustion alert. The test's
// copy of the rules has every `for:` at 0s and Prometheus evaluates every
// second; the shipped file stays as documented.
func TestPrometheusAlerts(t *testing.T) {
	for _, tool := range []string{"prometheus", "prometheus-node-exporter"} {
		requireTool(t, tool)
	}
	e := newEnv(t)
	e.requirePlugin(t)
	conf := e.reclaimConf(t, "minimal.conflist")
	setRange(t, conf, e.hostAddr(2), e.hostAddr(8)) // 7 addresses
	e.writeConflist(t, conf)

	textDir := t.TempDir()
	nodePort, promPort := freePort(t), freePort(t)
	startProcess(t, "prometheus-node-exporter", "--web.listen-address=127.0.0.1:"+nodePort,
		"--collector.disable-defaults", "--collector.textfile", "--collector.textfile.directory="+textDir)
	rules := filepath.Join(t.TempDir(), "rules.yml")
	shipped, err := os.ReadFile(filepath.Join(testhost.RepoDir(t), "packaging", "prometheus", "nomad-bridge-cni.rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	quick := regexp.MustCompile(`(?m)^(\s+for:) \S+$`).ReplaceAll(shipped, []byte("$1 0s"))
	if err := os.WriteFile(rules, quick, 0o644); err != nil {
		t.Fatal(err)
	}
	promConf := filepath.Join(t.TempDir(), "prometheus.yml")
	if err := os.WriteFile(promConf, fmt.Appendf(nil, "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [%q]\nscrape_configs:\n  - job_name: node\n    static_configs:\n      - targets: [\"127.0.0.1:%s\"]\n", rules, nodePort), 0o644); err != nil {
		t.Fatal(err)
	}
	startProcess(t, "prometheus", "--config.file="+promConf, "--storage.tsdb.path="+t.TempDir(), "--web.listen-address=127.0.0.1:"+promPort)
	api := "http://127.0.0.1:" + promPort

	metrics := func() {
		t.Helper()
		if _, stderr, err := e.operator(t, "metrics", "--data-dir", e.dataDir, "--conf-dir", e.confDir, "--textfile", filepath.Join(textDir, "nomad-bridge-cni.prom")); err != nil {
			t.Fatalf("metrics: %v\n%s", err, stderr)
		}
	}
	// firing waits until Prometheus's firing alerts of the network are
	// exactly want (alert names), having scraped at least once since the
	// textfile was written.
	firing := func(step string, want ...string) {
		t.Helper()
		slices.Sort(want)
		written := time.Now()
		deadline := time.Now().Add(90 * time.Second)
		var got []string
		for time.Now().Before(deadline) {
			got = firingAlerts(t, api, e.netName, written)
			if got != nil && slices.Equal(got, want) {
				return
			}
			time.Sleep(500 * time.Millisecond) // polling an HTTP API, not synchronising
		}
		t.Fatalf("%s: firing alerts %v, want %v", step, got, want)
	}

	live := e.addNetns(t, "live")
	e.mustCNI(t, "add", live, "")
	metrics()
	firing("healthy")
	// test/prometheus builds promtool's input series from its testdata:
	// they must be the series a real network's metrics have.
	real, fixture := seriesNames(t, filepath.Join(textDir, "nomad-bridge-cni.prom")), seriesNames(t, filepath.Join(testhost.RepoDir(t), "test", "prometheus", "testdata", "healthy.prom"))
	if !slices.Equal(real, fixture) {
		t.Errorf("a real network's metrics have the series %v; test/prometheus/testdata/healthy.prom has %v", real, fixture)
	}

	dead := e.addNetns(t, "dead")
	e.mustCNI(t, "add", dead, "")
	e.mustKillNetns(t, dead)
	metrics()
	firing("a container died without a DEL", "NomadBridgeCNIStaleAttachments")

	if out := e.operatorSweep(t); !strings.Contains(out, "released "+e.netName+" "+dead.cid) {
		t.Fatalf("gc did not release the dead container:\n%s", out)
	}
	metrics()
	firing("after gc")

	var filled []netns
	for i := range 2 { // 1 + 2 of 7 leased: 4 free, under 5
		ns := e.addNetns(t, fmt.Sprintf("fill%d", i))
		e.mustCNI(t, "add", ns, "")
		filled = append(filled, ns)
	}
	metrics()
	firing("the range filled to 4 free addresses", "NomadBridgeCNIAddressesExhausted")

	for _, ns := range append(filled, live) {
		e.mustCNI(t, "del", ns, "")
	}
	e.assertNetworkEmpty(t, e.leaseDir())
}

// seriesNames are the metric names a textfile has samples of, sorted.
func seriesNames(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for line := range strings.Lines(string(b)) {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// firingAlerts are the names of the alerts firing for network (or for no
// network: the textfile's own), sorted; nil until Prometheus has scraped
// node_exporter after since.
func firingAlerts(t *testing.T, api, network string, since time.Time) []string {
	t.Helper()
	var targets struct {
		Data struct {
			ActiveTargets []struct {
				LastScrape time.Time `json:"lastScrape"`
				Health     string    `json:"health"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	var alerts struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if getJSON(api+"/api/v1/targets", &targets) != nil || len(targets.Data.ActiveTargets) == 0 {
		return nil
	}
	// A rule evaluated after a scrape after the write.
	if tg := targets.Data.ActiveTargets[0]; tg.Health != "up" || !tg.LastScrape.After(since.Add(time.Second)) {
		return nil
	}
	if getJSON(api+"/api/v1/alerts", &alerts) != nil {
		return nil
	}
	names := []string{}
	for _, a := range alerts.Data.Alerts {
		if a.State == "firing" && (a.Labels["network"] == network || a.Labels["network"] == "") {
			names = append(names, a.Labels["alertname"])
		}
	}
	slices.Sort(names)
	return names
}

func getJSON(url string, v any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// freePort is a loopback TCP port nothing listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
}

// startProcess runs name until the test ends, its output kept for a
// failing test's log.
func startProcess(t *testing.T, name string, args ...string) {
	t.Helper()
	log, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			if b, err := os.ReadFile(log.Name()); err == nil {
				t.Logf("%s's log:\n%s", name, truncateText(string(b), 4000))
			}
		}
		log.Close()
	})
}
