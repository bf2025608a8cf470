package netconf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckDirsRefusesPlantedDirectories(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, c *Config)
		want  string
	}{
		{"dataDir is a symlink", func(t *testing.T, c *Config) { symlink(t, t.TempDir(), c.DataDir) }, "is a symlink"},
		{"network dir is a symlink", func(t *testing.T, c *Config) {
			mkdir(t, c.DataDir)
			symlink(t, t.TempDir(), c.Dir().Leases())
		}, "is a symlink"},
		{"records dir is a symlink", func(t *testing.T, c *Config) {
			mkdir(t, c.DataDir)
			symlink(t, t.TempDir(), filepath.Join(c.DataDir, ".nomad-bridge-cni"))
		}, "is a symlink"},
		{"network records dir is a symlink", func(t *testing.T, c *Config) {
			mkdir(t, filepath.Join(c.DataDir, ".nomad-bridge-cni"))
			symlink(t, t.TempDir(), filepath.Join(c.DataDir, ".nomad-bridge-cni", c.Name))
		}, "is a symlink"},
		{"network dir is a file", func(t *testing.T, c *Config) {
			mkdir(t, c.DataDir)
			if err := os.WriteFile(c.Dir().Leases(), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Config{Name: "net", DataDir: filepath.Join(t.TempDir(), "data")}
			tc.plant(t, c)
			err := c.Dir().Check()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Dir().Check() = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestCheckDirsAcceptsOwnAndMissingDirectories(t *testing.T) {
	c := &Config{Name: "net", DataDir: filepath.Join(t.TempDir(), "data")}
	if err := c.Dir().Check(); err != nil {
		t.Errorf("missing dirs: %v", err)
	}
	mkdir(t, c.Dir().Leases())
	mkdir(t, filepath.Join(c.DataDir, ".nomad-bridge-cni", "net"))
	if err := c.Dir().Check(); err != nil {
		t.Errorf("own dirs: %v", err)
	}
}

func TestCheckDirsRefusesForeignOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("this test needs root to chown a directory, and CI runs as root")
		}
		t.Skip("needs root to give a directory to another user")
	}
	c := &Config{Name: "net", DataDir: filepath.Join(t.TempDir(), "data")}
	mkdir(t, c.Dir().Leases())
	if err := os.Chown(c.Dir().Leases(), 12345, 12345); err != nil {
		t.Fatal(err)
	}
	if err := c.Dir().Check(); err == nil || !strings.Contains(err.Error(), "owned by uid 12345") {
		t.Errorf("Dir().Check() = %v, want a refusal naming the owner", err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	mkdir(t, filepath.Dir(link))
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
}
