package containerd

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
)

// The pause program (./pause) is built once per test binary, static, into
// a directory TestMain removes.
var pauseBuild struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func buildPause(t *testing.T) string {
	t.Helper()
	pauseBuild.once.Do(func() {
		pauseBuild.dir, pauseBuild.err = os.MkdirTemp("", "nbcd-pause-")
		if pauseBuild.err != nil {
			return
		}
		pauseBuild.path = filepath.Join(pauseBuild.dir, "pause")
		goTool := os.Getenv("GO")
		if goTool == "" {
			goTool = "go"
		}
		cmd := exec.Command(goTool, "build", "-trimpath", "-o", pauseBuild.path, "./pause")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			pauseBuild.err = fmt.Errorf("build ./pause: %w: %s", err, bytes.TrimSpace(out))
		}
	})
	if pauseBuild.err != nil {
		t.Fatal(pauseBuild.err)
	}
	return pauseBuild.path
}

func removePauseBuild() {
	if pauseBuild.dir != "" {
		_ = os.RemoveAll(pauseBuild.dir)
	}
}

// pauseEntrypoint is where the pause program sits in the image.
const pauseEntrypoint = "/pause"

// writePauseImage writes an OCI image layout tar (oci-layout, index.json,
// blobs/sha256/...) of one plain tar layer holding the pause program, named
// ref by containerd's io.containerd.image.name annotation, which `ctr
// images import` takes as the image's name.
func writePauseImage(t *testing.T, path, ref string) {
	t.Helper()
	pause, err := os.ReadFile(buildPause(t))
	if err != nil {
		t.Fatal(err)
	}
	layer, err := tarOf(map[string][]byte{pauseEntrypoint[1:]: pause}, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	layerDesc := descriptor("application/vnd.oci.image.layer.v1.tar", layer)
	config := mustJSON(t, map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config":       map[string]any{"Entrypoint": []string{pauseEntrypoint}},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDesc["digest"].(string)}},
	})
	configDesc := descriptor("application/vnd.oci.image.config.v1+json", config)
	manifest := mustJSON(t, map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        configDesc,
		"layers":        []any{layerDesc},
	})
	manifestDesc := descriptor("application/vnd.oci.image.manifest.v1+json", manifest)
	manifestDesc["platform"] = map[string]string{"architecture": runtime.GOARCH, "os": "linux"}
	manifestDesc["annotations"] = map[string]string{"io.containerd.image.name": ref}
	index := mustJSON(t, map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []any{manifestDesc},
	})
	files := map[string][]byte{
		"oci-layout": []byte(`{"imageLayoutVersion":"1.0.0"}`),
		"index.json": index,
	}
	for _, blob := range [][]byte{layer, config, manifest} {
		files["blobs/sha256/"+fmt.Sprintf("%x", sha256.Sum256(blob))] = blob
	}
	out, err := tarOf(files, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// descriptor is the OCI descriptor of blob.
func descriptor(mediaType string, blob []byte) map[string]any {
	return map[string]any{
		"mediaType": mediaType,
		"digest":    fmt.Sprintf("sha256:%x", sha256.Sum256(blob)),
		"size":      len(blob),
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// tarOf is a tar of files (with their parent directories), each of mode,
// in a fixed order and with fixed times: the same files give the same
// digest.
func tarOf(files map[string][]byte, mode int64) ([]byte, error) {
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		for d := filepath.Dir(name); d != "." && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	dirList := make([]string, 0, len(dirs))
	for d := range dirs {
		dirList = append(dirList, d)
	}
	slices.Sort(dirList)
	for _, d := range dirList {
		if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755}); err != nil {
			return nil, err
		}
	}
	for _, name := range names {
		data := files[name]
		if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data))}); err != nil {
			return nil, err
		}
		if _, err := w.Write(data); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
