package eventlog

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type buffer struct{ bytes.Buffer }

func (b *buffer) Close() error { return nil }

func lines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(s) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q is not JSON: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// Each stderr line of the plugin becomes one JSON event, sorted by what
// it says, with the verb's attachment on it; the level filters.
func TestLinesBecomeEventsOfTheirKind(t *testing.T) {
	var b buffer
	l := newLog(&b, Info, Attachment{Command: "CHECK", Network: "nomad", ContainerID: "c1", IfName: "eth0"})
	l.now = func() time.Time { return time.Unix(1764660000, 0) }
	var w io.Writer = l
	for _, msg := range []string{
		"nomad-bridge-cni: nomad: released c2/eth0 172.26.64.3: namespace /var/run/netns/x is gone; removed lease 172.26.64.3, record\n",
		"nomad-bridge-cni: warning: dataDir /var/lib/x is not on tmpfs\n",
		"nomad-bridge-cni: nomad: DEL c1/eth0: removed what bridge left: chain CNI-1\n",
		"nomad-bridge-cni: nomad: removed /run/cni/.nomad-bridge-cni/nomad/.tmp-1-2, abandoned by a writer that died\n",
		"nomad-bridge-cni: nomad: skipped: something\n",
		"nomad-bridge-cni: nomad: c3/eth0: its ADD's delegate ran past the deadline 2025-12-02T07:19:00Z with the plugin (pid 7) gone: killed pids [8]\n",
		"nomad-bridge-cni: nomad: a line that merely says extended\n",
	} {
		if _, err := w.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
	}
	l.Event(Debug, "start", "check", nil) // below Info: dropped
	l.Event(Error, "refusal", "no", map[string]any{"code": 11})
	got := lines(t, b.String())
	want := []string{"release", "warning", "recovery", "recovery", "info", "recovery", "info", "refusal"}
	if len(got) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(got), len(want), b.String())
	}
	for i, ev := range want {
		if got[i]["event"] != ev || got[i]["command"] != "CHECK" || got[i]["network"] != "nomad" || got[i]["containerID"] != "c1" || got[i]["time"] != "2025-12-02T07:20:00Z" {
			t.Errorf("line %d = %v, want event %s with the attachment", i, got[i], ev)
		}
		if _, ok := got[i]["netns"]; ok {
			t.Errorf("line %d = %v: an attachment field not set is written", i, got[i])
		}
	}
	if got[0]["message"] != "nomad: released c2/eth0 172.26.64.3: namespace /var/run/netns/x is gone; removed lease 172.26.64.3, record" {
		t.Errorf("message = %q", got[0]["message"])
	}
	if got[7]["level"] != "error" || got[7]["code"] != float64(11) {
		t.Errorf("refusal = %v", got[7])
	}

	b.Reset()
	l.level = Error
	w.Write([]byte("nomad-bridge-cni: nomad: released c3/eth0 x\n"))
	if b.Len() != 0 {
		t.Errorf("level error logged a release: %s", b.String())
	}
}

func TestParseLevel(t *testing.T) {
	for s, want := range map[string]Level{"": Info, "error": Error, "info": Info, "debug": Debug} {
		if got, err := ParseLevel(s); err != nil || got != want {
			t.Errorf("ParseLevel(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseLevel("verbose"); err == nil || !strings.Contains(err.Error(), "error, info, debug") {
		t.Errorf("ParseLevel(verbose) = %v", err)
	}
}

// The file is created, appended to, and rotated by size; a path that is a
// symlink (or anything but a regular file) is refused.
func TestOpenAppendsAndRefusesWhatIsNotAFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "nbc.log")
	for i := range 2 {
		l, err := Open(path, Info, Attachment{Command: "ADD"})
		if err != nil {
			t.Fatal(err)
		}
		l.Event(Info, "release", "r", map[string]any{"i": i})
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil || len(lines(t, string(b))) != 2 {
		t.Errorf("log after two opens: %q, %v", b, err)
	}
	target := filepath.Join(dir, "precious")
	if err := os.WriteFile(target, []byte("keep\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.log")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(link, Info, Attachment{}); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("Open of a symlink: %v", err)
	}
	if _, err := Open(dir, Info, Attachment{}); err == nil {
		t.Error("Open of a directory succeeded")
	}
	if b, _ := os.ReadFile(target); string(b) != "keep\n" {
		t.Errorf("the symlink's target changed: %q", b)
	}
}

// Past its size the file is rotated: a backup beside it, a new file, no
// line lost, at most maxBackups backups.
func TestRotatesBySize(t *testing.T) {
	defer func(was int) { maxSizeMB = was }(maxSizeMB)
	maxSizeMB = 1
	dir := t.TempDir()
	path := filepath.Join(dir, "nbc.log")
	l, err := Open(path, Info, Attachment{Command: "CHECK", Network: "nomad"})
	if err != nil {
		t.Fatal(err)
	}
	msg := strings.Repeat("x", 1000)
	const n = 1500 // about 1.6 MB of lines
	for range n {
		l.Event(Info, "release", msg, nil)
	}
	l.Close()
	entries, _ := os.ReadDir(dir)
	total := 0
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		total += len(lines(t, string(b)))
		if fi, _ := e.Info(); fi.Size() > 1<<20 {
			t.Errorf("%s is %d bytes, over the bound", e.Name(), fi.Size())
		}
	}
	if len(entries) != 2 || total != n {
		t.Errorf("%d files holding %d lines, want the file and one backup holding %d", len(entries), total, n)
	}
}

// lumberjack opens the log file by its name again at the first line and
// at each rotation, through a symlink: in a directory others may write
// (Ubuntu's /var/log is the syslog group's), or under one, such a user
// could put a link in its place and have the plugin, as root, append to or
// truncate what it names. Such a log file is refused; a sticky directory
// (/tmp) lets nobody replace another's file, and is fine.
func TestOpenRefusesADirectoryOthersMayWrite(t *testing.T) {
	mkdir := func(path string, mode os.FileMode) string {
		t.Helper()
		if err := os.Mkdir(path, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	for _, tc := range []struct {
		name    string
		dir     func(base string) string
		refused bool
	}{
		{"group-writable", func(b string) string { return mkdir(filepath.Join(b, "logs"), 0o775) }, true},
		{"world-writable", func(b string) string { return mkdir(filepath.Join(b, "logs"), 0o757) }, true},
		{"under a writable one", func(b string) string {
			return mkdir(filepath.Join(mkdir(filepath.Join(b, "var"), 0o777), "logs"), 0o755)
		}, true},
		{"through a link to a writable one", func(b string) string {
			real := mkdir(filepath.Join(b, "real"), 0o777)
			if err := os.Symlink(real, filepath.Join(b, "logs")); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(b, "logs")
		}, true},
		{"sticky", func(b string) string { return mkdir(filepath.Join(b, "logs"), 0o777|os.ModeSticky) }, false},
		{"the plugin's own", func(b string) string { return mkdir(filepath.Join(b, "logs"), 0o755) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(tc.dir(t.TempDir()), "nbc.log")
			l, err := Open(path, Info, Attachment{})
			if tc.refused {
				if err == nil || !strings.Contains(err.Error(), "others") {
					t.Errorf("Open = %v, want it refused: others may write there", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			l.Close()
		})
	}
}
