package records

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// tmpfsStore is a store whose data dir is on tmpfs (/dev/shm), where the
// walk cache is kept.
func tmpfsStore(t *testing.T) *Store {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "nbc-records-test-")
	if err != nil {
		t.Fatalf("a tmpfs temp dir: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return NewStore(ipamdir.New(dir, "nomad"))
}

// diskStore is a store whose data dir is not on tmpfs.
func diskStore(t *testing.T) *Store {
	t.Helper()
	return NewStore(ipamdir.New(testhost.DirOffTmpfs(t), "nomad"))
}

func writeRecords(t *testing.T, s *Store, n int) map[Key]*Record {
	t.Helper()
	out := map[Key]*Record{}
	for i := range n {
		r := sample()
		r.ContainerID = fmt.Sprintf("c%04d", i)
		r.IPs = []string{fmt.Sprintf("10.0.%d.%d/16", i/250, i%250+2)}
		if err := s.Write(r); err != nil {
			t.Fatal(err)
		}
		out[r.Key()] = r
	}
	return out
}

// sweepLike walks s as a sweep that releases nothing does: a walk, then
// SaveWalkCache. It returns the records by key and how many came from the
// cache.
func sweepLike(t *testing.T, s *Store) (map[Key]*Record, int) {
	t.Helper()
	got := map[Key]*Record{}
	cached := 0
	l, err := s.WalkStreaming(func(r *Record) {
		if r.FromCache() {
			cached++
		}
		got[r.Key()] = r
	}, func(err error, k Key, named bool) { t.Errorf("damaged %s: %v", k, err) }, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SaveWalkCache(l, nil)
	return got, cached
}

// sameRecords compares records as they are on disk (FromCache aside).
func sameRecords(t *testing.T, got, want map[Key]*Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("walk gave %d records, want %d", len(got), len(want))
	}
	for k, w := range want {
		g := got[k]
		if g == nil {
			t.Errorf("walk did not give %s", k)
			continue
		}
		c := *g
		c.fromCache = false
		if !reflect.DeepEqual(&c, w) {
			t.Errorf("walk gave %s as %+v, want %+v", k, c, w)
		}
	}
}

func cacheEntries(t *testing.T, s *Store) (walkCache, bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.Dir(), walkCacheName))
	if os.IsNotExist(err) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	c, ok := decodeWalkCache(b)
	if !ok {
		t.Fatalf("the walk wrote a cache it cannot read:\n%q", b)
	}
	return c, true
}

func TestWalkCacheSparesTheReadsOfUnchangedRecords(t *testing.T) {
	s := tmpfsStore(t)
	want := writeRecords(t, s, 300)
	got, cached := sweepLike(t, s)
	sameRecords(t, got, want)
	if cached != 0 {
		t.Errorf("first walk took %d records from a cache that did not exist", cached)
	}
	if c, ok := cacheEntries(t, s); !ok || len(c) != 300 {
		t.Fatalf("cache after the first walk holds %d records (exists: %v), want 300", len(c), ok)
	}
	got, cached = sweepLike(t, s)
	sameRecords(t, got, want)
	if cached != 300 {
		t.Errorf("second walk took %d records from the cache, want all 300", cached)
	}
}

func TestWalkCacheReadsReplacedAndNewRecordsAndForgetsRemovedOnes(t *testing.T) {
	s := tmpfsStore(t)
	want := writeRecords(t, s, 20)
	sweepLike(t, s)

	// A re-ADD of c0003 (same key, another namespace), a new container, a
	// DEL: each a new file or a file gone, never a change in place.
	replaced := *want[Key{"c0003", "eth0"}]
	replaced.Netns, replaced.NetnsID.Ino = "/var/run/netns/y", 4026532999
	if err := s.Write(&replaced); err != nil {
		t.Fatal(err)
	}
	want[replaced.Key()] = &replaced
	added := sample()
	added.ContainerID = "new"
	if err := s.Write(added); err != nil {
		t.Fatal(err)
	}
	want[added.Key()] = added
	if err := s.Remove(Key{"c0007", "eth0"}); err != nil {
		t.Fatal(err)
	}
	delete(want, Key{"c0007", "eth0"})

	got, cached := sweepLike(t, s)
	sameRecords(t, got, want)
	if cached != 18 {
		t.Errorf("took %d records from the cache, want the 18 unchanged ones", cached)
	}
	for _, k := range []Key{replaced.Key(), added.Key()} {
		if got[k].FromCache() {
			t.Errorf("%s came from the cache: it is a new file", k)
		}
	}
	c, _ := cacheEntries(t, s)
	if _, ok := c[fileName(Key{"c0007", "eth0"})]; ok || len(c) != 20 {
		t.Errorf("cache after the changes holds %d records (removed c0007 in it: %v), want the 20 on disk", len(c), ok)
	}
	got, cached = sweepLike(t, s)
	sameRecords(t, got, want)
	if cached != 20 {
		t.Errorf("third walk took %d from the cache, want 20", cached)
	}
}

func TestWalkCacheDropsWhatTheSweepReleased(t *testing.T) {
	s := tmpfsStore(t)
	writeRecords(t, s, 5)
	release := func(keys ...Key) {
		// The sweep removes the record of what it releases after the walk
		// read it, and before SaveWalkCache.
		got := map[Key]bool{}
		l, err := s.WalkStreaming(func(r *Record) { got[r.Key()] = true }, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if !got[k] {
				t.Fatalf("walk did not give %s", k)
			}
			if err := s.Remove(k); err != nil {
				t.Fatal(err)
			}
		}
		s.SaveWalkCache(l, func(k Key) bool { return slices.Contains(keys, k) })
	}
	gone := []Key{{"c0001", "eth0"}, {"c0004", "eth0"}}
	release(gone...)
	c, _ := cacheEntries(t, s)
	if len(c) != 3 {
		t.Errorf("cache holds %d records, want the 3 not released", len(c))
	}
	for _, k := range gone {
		if _, ok := c[fileName(k)]; ok {
			t.Errorf("cache holds released %s", k)
		}
	}
	release(Key{"c0000", "eth0"}, Key{"c0002", "eth0"}, Key{"c0003", "eth0"})
	if _, ok := cacheEntries(t, s); ok {
		t.Error("a cache of nothing was left behind")
	}
}

func TestWalkCacheNeverHoldsPendingOrAddresslessRecords(t *testing.T) {
	s := tmpfsStore(t)
	pending := sample()
	pending.ContainerID, pending.State, pending.IPs, pending.PID = "pending", Started, nil, 42
	noIPs := sample()
	noIPs.ContainerID, noIPs.IPs = "noips", nil
	for _, r := range []*Record{pending, noIPs} {
		if err := s.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	sweepLike(t, s)
	if _, ok := cacheEntries(t, s); ok {
		t.Error("a cache was written of records a walk must always read")
	}
	// Nor is one taken from a cache that says so (planted, or another
	// version's).
	st := statIno(t, filepath.Join(s.Dir(), fileName(pending.Key())))
	b := encodeWalkCache([]cachedRecord{{name: fileName(pending.Key()), ino: st, data: []byte(mustJSON(t, pending))}})
	if err := os.WriteFile(filepath.Join(s.Dir(), walkCacheName), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, cached := sweepLike(t, s); cached != 0 {
		t.Errorf("%d pending records taken from the cache", cached)
	}
}

func statIno(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func TestWalkCacheThatCannotBeReadIsIgnoredAndReplaced(t *testing.T) {
	s := tmpfsStore(t)
	want := writeRecords(t, s, 4)
	name := fileName(Key{"c0002", "eth0"})
	ino := statIno(t, filepath.Join(s.Dir(), name))
	good := string(encodeWalkCache([]cachedRecord{{name: name, ino: ino, data: []byte(mustJSON(t, want[Key{"c0002", "eth0"}]))}}))
	for what, content := range map[string]string{
		"empty":           "",
		"other magic":     "nomad-bridge-cni walk cache 2\n" + good[len(walkCacheMagic):],
		"truncated":       good[:len(good)-5],
		"count too large": walkCacheMagic + "2\n" + good[len(walkCacheMagic)+2:],
		"not a record":    walkCacheMagic + "1\n9 5 2\n.lock{}\n",
		"duplicate":       good + good[len(walkCacheMagic)+2:],
		"a directory":     "",
	} {
		t.Run(what, func(t *testing.T) {
			path := filepath.Join(s.Dir(), walkCacheName)
			os.RemoveAll(path)
			var err error
			if what == "a directory" {
				err = os.Mkdir(path, 0o700)
			} else {
				err = os.WriteFile(path, []byte(content), 0o600)
			}
			if err != nil {
				t.Fatal(err)
			}
			got, cached := sweepLike(t, s)
			sameRecords(t, got, want)
			if cached != 0 {
				t.Errorf("%d records taken from a cache that cannot be read", cached)
			}
			if what == "a directory" {
				return // not replaced: a rename onto a directory fails; the walk goes on reading files
			}
			if c, ok := cacheEntries(t, s); !ok || len(c) != 4 {
				t.Errorf("cache not replaced by a good one: %d records", len(c))
			}
		})
	}
}

func TestWalkCacheOnlyOnTmpfs(t *testing.T) {
	s := diskStore(t)
	want := writeRecords(t, s, 10)
	for range 2 {
		got, cached := sweepLike(t, s)
		sameRecords(t, got, want)
		if cached != 0 {
			t.Errorf("%d records taken from a cache off tmpfs", cached)
		}
	}
	if _, err := os.Lstat(filepath.Join(s.Dir(), walkCacheName)); !os.IsNotExist(err) {
		t.Errorf("a walk cache was written off tmpfs (lstat: %v)", err)
	}
}

func TestWalkCacheIsNotWrittenByWalksThatMustChangeNothing(t *testing.T) {
	s := tmpfsStore(t)
	writeRecords(t, s, 3)
	sweepLike(t, s.WithoutCacheWrites())
	if _, err := os.Lstat(filepath.Join(s.Dir(), walkCacheName)); !os.IsNotExist(err) {
		t.Errorf("a dry walk wrote the cache (lstat: %v)", err)
	}
	sweepLike(t, s)
	if _, cached := sweepLike(t, s.WithoutCacheWrites()); cached != 3 {
		t.Errorf("a dry walk took %d records from the cache, want 3", cached)
	}
}

func TestWalkCacheOfTooManyRecordsIsNotKept(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 2049 records")
	}
	s := tmpfsStore(t)
	writeRecords(t, s, 10)
	sweepLike(t, s)
	writeRecords(t, s, walkCacheMax+1)
	got, _ := sweepLike(t, s)
	if len(got) != walkCacheMax+1 {
		t.Fatalf("walk gave %d records", len(got))
	}
	if _, ok := cacheEntries(t, s); ok {
		t.Errorf("a cache of more than %d records was kept", walkCacheMax)
	}
}

func TestWalkCacheRoundTrip(t *testing.T) {
	recs := []cachedRecord{
		{name: "c1@eth0", ino: 7, data: []byte(`{"a":1}`)},
		{name: "c2@net1", ino: 1 << 63, data: []byte("two\nlines")},
	}
	c, ok := decodeWalkCache(encodeWalkCache(recs))
	if !ok || len(c) != 2 {
		t.Fatalf("decode(encode) = %v, %v", c, ok)
	}
	for _, r := range recs {
		if b, ok := c.lookup(r.name, r.ino); !ok || string(b) != string(r.data) {
			t.Errorf("lookup(%s, %d) = %q, %v", r.name, r.ino, b, ok)
		}
		if _, ok := c.lookup(r.name, r.ino+1); ok {
			t.Errorf("lookup(%s) with another inode hit", r.name)
		}
	}
}
