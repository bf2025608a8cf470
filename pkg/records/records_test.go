package records

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/dirstate"
)

func sample() *Record {
	return &Record{
		Version: FormatVersion, Network: "nomad", ContainerID: "c1", IfName: "eth0",
		Netns: "/var/run/netns/x", NetnsID: sysinfo.NetnsID{Dev: 4, Ino: 4026532000},
		BootID: "b", Created: time.Unix(1764660000, 0).UTC(), State: Complete, IPs: []string{"172.26.64.2/20"},
	}
}

func TestWriteReadRemove(t *testing.T) {
	dataDir := t.TempDir()
	s := NewStore(ipamdir.New(dataDir, "nomad"))
	if got, err := s.Read(Key{"c1", "eth0"}); got != nil || err != nil {
		t.Fatalf("Read before Write = %v, %v", got, err)
	}
	want := sample()
	if err := s.Write(want); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dataDir, ".nomad-bridge-cni", "nomad", "c1@eth0")
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("record file %s: %v %v, want mode 0600", path, fi, err)
	}
	if fi, err := os.Stat(filepath.Dir(path)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("record dir mode: %v %v, want 0700", fi, err)
	}
	got, err := s.Read(Key{"c1", "eth0"})
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("Read = %+v, %v; want %+v", got, err, want)
	}
	if err := s.Remove(Key{"c1", "eth0"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(Key{"c1", "eth0"}); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 0 {
		t.Errorf("left behind: %v", entries)
	}
}

func TestListSkipsAndReportsDamagedRecords(t *testing.T) {
	s := NewStore(ipamdir.New(t.TempDir(), "nomad"))
	if err := s.Write(sample()); err != nil {
		t.Fatal(err)
	}
	other := sample()
	other.Network = "other"
	bad := map[string]string{
		"garbage@eth0": "{not json",
		"empty@eth0":   "",
		"c2@eth0":      mustJSON(t, other),    // wrong network
		"c3@eth0":      mustJSON(t, sample()), // names c1@eth0
	}
	for name, content := range bad {
		if err := os.WriteFile(filepath.Join(s.dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(s.dir, "dir@eth0"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.dir, ".tmp-123"), []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := walkAll(s)
	if err != nil {
		t.Fatal(err)
	}
	recs, problems := l.Records, l.Problems
	if len(recs) != 1 || recs[0].ContainerID != "c1" {
		t.Errorf("records = %+v, want only c1", recs)
	}
	if len(problems) != 5 {
		t.Errorf("problems = %d %v, want 5", len(problems), problems)
	}
	for _, p := range problems {
		if !strings.Contains(p.Error(), s.dir) && !strings.Contains(p.Error(), "read record") {
			t.Errorf("problem does not name the file: %v", p)
		}
	}
}

func TestListOfMissingDirectoryIsEmpty(t *testing.T) {
	l, err := walkAll(NewStore(ipamdir.New(t.TempDir(), "none")))
	if err != nil || l.Records != nil || l.Problems != nil || l.Temps != nil {
		t.Errorf("List = %+v, %v", l, err)
	}
}

func mustJSON(t *testing.T, r *Record) string {
	t.Helper()
	s := NewStore(ipamdir.New(t.TempDir(), r.Network))
	if err := s.Write(r); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(s.dir, fileName(r.Key())))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestReadDoesNotFollowASymlinkedRecord(t *testing.T) {
	s := NewStore(ipamdir.New(t.TempDir(), "nomad"))
	if err := s.Write(sample()); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.WriteFile(target, []byte(mustJSON(t, sample())), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(s.dir, "c1@eth0")
	os.Remove(path)
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Read(Key{"c1", "eth0"}); err == nil || r != nil {
		t.Errorf("Read followed a symlink: %+v, %v", r, err)
	}
	l, _ := walkAll(s)
	if len(l.Records) != 0 || len(l.Problems) != 1 {
		t.Errorf("List: %d records, problems %v; want the symlink reported", len(l.Records), l.Problems)
	}
	// Remove deletes the link, never its target.
	if err := s.Remove(Key{"c1", "eth0"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(target); err != nil {
		t.Errorf("symlink target removed: %v", err)
	}
}

func TestAbandonedTempFilesAreRemovedOnlyWhenTheirWriterIsGone(t *testing.T) {
	s := NewStore(ipamdir.New(t.TempDir(), "nomad"))
	if err := s.Write(sample()); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{".tmp-111-1", ".tmp-222-2", ".tmp-x-3", ".migrated"} {
		if err := os.WriteFile(filepath.Join(s.dir, name), []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	l, err := walkAll(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Records) != 1 || len(l.Problems) != 0 || len(l.Temps) != 2 {
		t.Fatalf("listing = %+v", l)
	}
	removed, err := s.RemoveAbandonedTemps(l.Temps, func(pid int) bool { return pid == 222 })
	if err != nil || len(removed) != 1 || !strings.HasSuffix(removed[0], ".tmp-111-1") {
		t.Errorf("removed %v, %v; want only the dead writer's file", removed, err)
	}
	for _, kept := range []string{".tmp-222-2", ".tmp-x-3", ".migrated", "c1@eth0"} {
		if _, err := os.Stat(filepath.Join(s.dir, kept)); err != nil {
			t.Errorf("%s removed: %v", kept, err)
		}
	}
}

// A network large enough to be read on several goroutines lists every
// record exactly once and every damaged file as a problem, as a small one.
func TestListLargeNetwork(t *testing.T) {
	s := NewStore(ipamdir.New(t.TempDir(), "nomad"))
	const n, damaged = 1500, 7
	for i := range n {
		r := sample()
		r.ContainerID = fmt.Sprintf("c%04d", i)
		if err := s.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	for i := range damaged {
		if err := os.WriteFile(filepath.Join(s.dir, fmt.Sprintf("bad%d@eth0", i)), []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	l, err := walkAll(s)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range l.Records {
		if seen[r.ContainerID] {
			t.Fatalf("%s listed twice", r.ContainerID)
		}
		seen[r.ContainerID] = true
	}
	if len(seen) != n || len(l.Problems) != damaged {
		t.Errorf("listed %d records and %d problems, want %d and %d", len(seen), len(l.Problems), n, damaged)
	}
}

// A FIFO where a record should be is an error, not a read that waits
// forever for a writer (which would hang a DEL or a sweep).
func TestReadDoesNotBlockOnAFIFO(t *testing.T) {
	s := NewStore(ipamdir.New(t.TempDir(), "nomad"))
	if err := s.Write(sample()); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(s.dir, "c1@eth0")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	dirstate.PlantFIFO(t, path) // its cleanup lets a blocked reader go
	done := make(chan error, 1)
	go func() {
		r, err := s.Read(Key{"c1", "eth0"})
		if err == nil {
			err = fmt.Errorf("read a record from a FIFO: %+v", r)
		} else {
			err = nil
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Read blocked on a FIFO")
	}
}

// listing is what a walk found, its records and damaged files collected.
type listing struct {
	Temps    map[string]int
	Records  []*Record
	Problems []error
}

func walkAll(s *Store) (*listing, error) {
	out := &listing{}
	l, err := s.Walk(func(r *Record) { out.Records = append(out.Records, r) }, func(err error, k Key, named bool) {
		out.Problems = append(out.Problems, err)
	})
	if err != nil {
		return nil, err
	}
	out.Temps = l
	return out, nil
}

// The caller gets every entry once, in name order (within the directory's
// batches of 1024), each damaged file where it lies.
func TestWalkDeliversInNameOrder(t *testing.T) {
	s := NewStore(ipamdir.New(t.TempDir(), "nomad"))
	const n = 700 // one directory batch
	var want []string
	for i := range n {
		name := fmt.Sprintf("c%04d@eth0", i)
		switch {
		case i%97 == 5: // damaged
			if err := os.WriteFile(filepath.Join(s.dir, name), []byte("{"), 0o600); err != nil {
				t.Fatal(err)
			}
			want = append(want, "damaged "+name)
			continue
		case i%101 == 7: // a temp file of a dead writer, then a boot marker
			if err := os.WriteFile(filepath.Join(s.dir, fmt.Sprintf(".tmp-%d-1", 4000000+i)), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		r := sample()
		r.ContainerID = fmt.Sprintf("c%04d", i)
		if err := s.Write(r); err != nil {
			t.Fatal(err)
		}
		want = append(want, "record "+name)
	}
	if err := os.WriteFile(filepath.Join(s.dir, ".migrated"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var got []string
	temps, err := s.Walk(func(r *Record) {
		got = append(got, "record "+fileName(r.Key()))
	}, func(err error, k Key, named bool) {
		got = append(got, "damaged "+fileName(k))
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("walk delivered %d entries, want %d in name order; first difference at %d", len(got), len(want), firstDiff(got, want))
	}
	if len(temps) != 7 {
		t.Errorf("temps = %d, want 7", len(temps))
	}
}

func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func fileName(k Key) string { return ipamdir.RecordName(k.ContainerID, k.IfName) }
