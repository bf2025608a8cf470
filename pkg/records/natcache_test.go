package records

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestNATCacheKeepsOwnersUnderTheirKey: what is saved under a key is
// loaded under that key only, quoted owners included; a store that must
// change nothing writes nothing; DropCaches removes it with the walk
// cache, however the sweep left them.
func TestNATCacheKeepsOwnersUnderTheirKey(t *testing.T) {
	s := tmpfsStore(t)
	owners := []string{"c1", `quo"te`, "new\nline", "ünï"}
	// A network without a record directory gets none from the cache.
	s.SaveNATCache("k1", owners)
	if _, err := os.Lstat(s.Dir()); !os.IsNotExist(err) {
		t.Fatalf("SaveNATCache made the record directory: %v", err)
	}
	if err := os.MkdirAll(s.Dir(), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.LoadNATCache("k1"); ok {
		t.Fatal("a cache before any was saved")
	}
	s.WithoutCacheWrites().SaveNATCache("k1", owners)
	if _, ok := s.LoadNATCache("k1"); ok {
		t.Fatal("a store made WithoutCacheWrites wrote the NAT cache")
	}
	s.SaveNATCache("k1", owners)
	if got, ok := s.LoadNATCache("k1"); !ok || !slices.Equal(got, owners) {
		t.Fatalf("loaded %q, %v; want %q", got, ok, owners)
	}
	if _, ok := s.LoadNATCache("k2"); ok {
		t.Fatal("owners kept under k1 were loaded under k2")
	}
	s.SaveNATCache("k2", nil)
	if got, ok := s.LoadNATCache("k2"); !ok || len(got) != 0 {
		t.Fatalf("no owners under k2: loaded %q, %v", got, ok)
	}
	if err := s.DropCaches(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(s.Dir(), natCacheName)); !os.IsNotExist(err) {
		t.Fatalf("NAT cache after DropCaches: %v", err)
	}
	if err := s.DropCaches(); err != nil {
		t.Fatalf("DropCaches with nothing to drop: %v", err)
	}
}

// TestNATCacheThatCannotBeReadIsIgnored: a damaged, planted or
// other-version file gives nothing.
func TestNATCacheThatCannotBeReadIsIgnored(t *testing.T) {
	s := tmpfsStore(t)
	if err := os.MkdirAll(s.Dir(), 0o700); err != nil {
		t.Fatal(err)
	}
	s.SaveNATCache("k", []string{"c1"})
	path := filepath.Join(s.Dir(), natCacheName)
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{
		"other version": strings.Replace(string(good), "cache 1", "cache 2", 1),
		"truncated":     string(good[:len(good)-1]),
		"unquoted":      natCacheMagic + `"k"` + "\nc1\n",
		"empty owner":   natCacheMagic + `"k"` + "\n\"\"\n",
		"no key":        natCacheMagic,
	} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if got, ok := s.LoadNATCache("k"); ok {
			t.Errorf("%s: loaded %q", name, got)
		}
	}
	os.Remove(path)
	if err := os.Symlink("/etc/passwd", path); err != nil {
		t.Fatal(err)
	}
	if got, ok := s.LoadNATCache("k"); ok {
		t.Errorf("through a symlink: loaded %q", got)
	}
}
