package podman

import (
	"archive/tar"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// appletLinks are the busybox applets the containers run.
var appletLinks = []string{"sh", "httpd", "sleep", "cat"}

// importImage builds a root filesystem of one static busybox, its applet
// links, a pause script and an index page holding the env's token, and imports it with
// `podman import`: no registry is needed.
func (e *env) importImage(t *testing.T) {
	t.Helper()
	path := filepath.Join(e.base, "rootfs.tar")
	if err := e.writeRootfs(path); err != nil {
		t.Fatalf("build rootfs: %v", err)
	}
	e.mustPodman(t, "import", "--quiet", "--change", `CMD ["/bin/sh"]`, path, e.image)
}

func (e *env) writeRootfs(path string) error {
	busybox, err := os.ReadFile(busyboxPath)
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := tar.NewWriter(f)
	now := time.Now()
	dirs := []string{"bin", "www", "etc", "proc", "sys", "dev", "tmp", "run"}
	for _, d := range dirs {
		if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: now}); err != nil {
			return err
		}
	}
	files := []struct {
		name string
		mode int64
		data []byte
	}{
		{"bin/busybox", 0o755, busybox},
		{"www/index.html", 0o644, []byte(e.token)},
		// A pod's infra command: podman takes --infra-command as one
		// executable, without arguments.
		{"bin/pause", 0o755, []byte("#!/bin/sh\nexec sleep 2147483647\n")},
	}
	for _, file := range files {
		if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: file.name, Mode: file.mode, Size: int64(len(file.data)), ModTime: now}); err != nil {
			return err
		}
		if _, err := w.Write(file.data); err != nil {
			return err
		}
	}
	for _, applet := range appletLinks {
		if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox", Mode: 0o777, ModTime: now}); err != nil {
			return err
		}
	}
	if err := w.Close(); err != nil {
		return err
	}
	return f.Close()
}
