// Package eventlog is the plugin's optional log file (the entry's "logFile"
// and "logLevel", as multus has them): every release, refusal and recovery
// as one JSON line, in a file whose size lumberjack bounds and rotates.
// Off unless configured: a verb without it opens nothing.
package eventlog

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"gopkg.in/natefinch/lumberjack.v2"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
)

// Level is how much the log says.
type Level int

const (
	// Error: refusals and errors only.
	Error Level = iota
	// Info (the default): also releases, recoveries and warnings.
	Info
	// Debug: also each verb's start and end.
	Debug
)

// levels are the "logLevel" values, by Level.
var levels = []string{"error", "info", "debug"}

// ParseLevel reads a "logLevel" value; "" is Info.
func ParseLevel(s string) (Level, error) {
	if s == "" {
		return Info, nil
	}
	if i := slices.Index(levels, s); i >= 0 {
		return Level(i), nil
	}
	return Info, fmt.Errorf("%q is not one of %s", s, strings.Join(levels, ", "))
}

// Size bounds of the file: each process appends; once the file passes
// maxSizeMB, the process that notices renames it to a timestamped backup
// and starts a new one, keeping maxBackups of them. Two plugins rotating at
// once make one more, smaller, backup: no line is lost, since each line is
// one write(2) on an O_APPEND descriptor.
var maxSizeMB = 10 // tests make it smaller

const maxBackups = 5

// Log is one verb's log: its lines carry the verb's attachment.
type Log struct {
	out   io.WriteCloser
	level Level
	base  map[string]any // the attachment's fields that are set
	now   func() time.Time
}

// Attachment is what each line of a verb says it is about.
type Attachment struct {
	Command, Network, ContainerID, IfName, Netns string
}

// Open opens (creating) the log file at path. A path that exists and is
// not a regular file (a symlink, a device, a directory) is refused: the
// plugin runs as root, and a careless "logFile" must not make it append to
// whatever it names.
func Open(path string, level Level, a Attachment) (*Log, error) {
	if fi, err := os.Lstat(path); err == nil && !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("log file %s is not a regular file", path)
	} else if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("log file: %w", err)
	}
	if err := checkDirs(path); err != nil {
		return nil, err
	}
	return newLog(&lumberjack.Logger{Filename: path, MaxSize: maxSizeMB, MaxBackups: maxBackups}, level, a), nil
}

// checkDirs refuses a log file in, or under, a directory that others than
// root and the plugin's own user may write: lumberjack opens the file by
// its name again at the first line and at each rotation, through a
// symlink, which such a user could put in its place (Ubuntu's /var/log is
// the syslog group's). As sshd's StrictModes, a sticky directory (/tmp)
// passes: nobody may replace another's file there. A directory not made
// yet is lumberjack's to make, under one that is checked.
func checkDirs(path string) error {
	dir := filepath.Dir(path)
	for !statefile.Exists(dir) && dir != filepath.Dir(dir) {
		dir = filepath.Dir(dir)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fmt.Errorf("log file: %w", err)
	}
	for d := real; ; d = filepath.Dir(d) {
		fi, err := os.Lstat(d)
		if err != nil {
			return fmt.Errorf("log file: %w", err)
		}
		owner := fi.Sys().(*syscall.Stat_t).Uid
		if owner != 0 && int(owner) != os.Geteuid() || fi.Mode().Perm()&0o022 != 0 && fi.Mode()&os.ModeSticky == 0 {
			return fmt.Errorf("log file %s: others may write %s (owner %d, %s): a link put in the file's place would be followed; use a directory only root writes", path, d, owner, fi.Mode())
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

func newLog(out io.WriteCloser, level Level, a Attachment) *Log {
	base := map[string]any{"command": a.Command, "network": a.Network, "containerID": a.ContainerID, "ifName": a.IfName, "netns": a.Netns}
	maps.DeleteFunc(base, func(_ string, v any) bool { return v == "" })
	return &Log{out: out, level: level, base: base, now: time.Now}
}

// Event writes one line, if the log's level takes it. extra adds fields;
// writing never fails a verb, so its errors are dropped.
func (l *Log) Event(level Level, event, message string, extra map[string]any) {
	if level > l.level {
		return
	}
	line := map[string]any{"time": l.now().UTC().Format(time.RFC3339Nano), "level": levels[level], "event": event, "message": message, "pid": os.Getpid()}
	maps.Copy(line, l.base)
	maps.Copy(line, extra)
	b, err := json.Marshal(line)
	if err != nil {
		return
	}
	_, _ = l.out.Write(append(b, '\n'))
}

// Close closes the file.
func (l *Log) Close() error {
	return l.out.Close()
}

// Write takes the plugin's stderr lines ("nomad-bridge-cni: <message>",
// one per write): each becomes an event, its kind told by what it says
// (see kindOf).
func (l *Log) Write(p []byte) (int, error) {
	for line := range strings.Lines(string(p)) {
		msg := strings.TrimSpace(strings.TrimPrefix(line, "nomad-bridge-cni: "))
		if msg == "" {
			continue
		}
		l.Event(Info, kindOf(msg), msg, nil)
	}
	return len(p), nil
}

// kindOf sorts a line the plugin writes to stderr, each logged at Info: a
// release of what a dead attachment held, a recovery (the plugin finished
// or undid what something else left), a warning, or other news.
func kindOf(msg string) string {
	switch {
	case strings.HasPrefix(msg, "warning:"):
		return "warning"
	case strings.Contains(msg, ": released "):
		return "release"
	case strings.Contains(msg, "removed what bridge left"), strings.Contains(msg, "abandoned by a writer"),
		strings.Contains(msg, ": migrated "), strings.Contains(msg, "then it succeeded"),
		strings.Contains(msg, "released by the plugin"), strings.Contains(msg, "nothing to delete"),
		strings.Contains(msg, "legacy lease is removed instead"), strings.Contains(msg, "ran past the deadline"):
		return "recovery"
	}
	return "info"
}
