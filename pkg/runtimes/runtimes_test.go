package runtimes

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The Nomad lister asks the local agent as the nomad CLI does, with its
// token: the node's pending and running allocations are listed, the
// others not; an error status is an error, never an empty list.
func TestNomadListsTheNodesLiveAllocations(t *testing.T) {
	const node = "f7b9a5e2-1c3d-4e5f-8a9b-0c1d2e3f4a5b"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Nomad-Token") != "secret" {
			http.Error(w, "Permission denied", http.StatusForbidden)
			return
		}
		switch r.URL.Path {
		case "/v1/agent/self":
			// Recorded from a Nomad 1.10 client agent (trimmed).
			w.Write([]byte(`{"config":{"Client":{"Enabled":true}},"member":{"Name":"nbc"},"stats":{"client":{"node_id":"` + node + `","known_servers":"127.0.0.1:4647","num_allocations":"3"},"nomad":{"server":"true"}}}`))
		case "/v1/node/" + node + "/allocations":
			w.Write([]byte(`[{"ID":"0dc525f4-c491-7e25-a67d-0121069ad55e","ClientStatus":"running","DesiredStatus":"run"},
				{"ID":"7f3b9a2e-51c4-4d0b-9e1a-2c6d8f4e0b17","ClientStatus":"pending","DesiredStatus":"run"},
				{"ID":"c0a1c0a1-0000-4000-8000-00000000c0de","ClientStatus":"complete","DesiredStatus":"stop"},
				{"ID":"5e1f0c2d-6a7b-4c8d-9e0f-1a2b3c4d5e61","ClientStatus":"lost","DesiredStatus":"stop"}]`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	t.Setenv("NOMAD_ADDR", srv.URL+"/")
	t.Setenv("NOMAD_TOKEN", "secret")
	l, err := New("nomad")
	if err != nil {
		t.Fatal(err)
	}
	got, err := l.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.IDs) != 2 || !got.IDs["0dc525f4-c491-7e25-a67d-0121069ad55e"] || !got.IDs["7f3b9a2e-51c4-4d0b-9e1a-2c6d8f4e0b17"] {
		t.Errorf("listed %v, want the running and the pending allocation", got.IDs)
	}

	t.Setenv("NOMAD_TOKEN", "wrong")
	l, _ = New("nomad")
	if _, err := l.List(context.Background()); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("with a wrong token: %v, want the 403", err)
	}
	srv.Close()
	if _, err := l.List(context.Background()); err == nil {
		t.Error("an unreachable agent listed nothing without an error")
	}
}

// The podman lister reads podman ps: what has exited is not listed; a
// failing podman is an error.
func TestPodmanListsWhatIsNotExited(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "podman")
	script := "#!/bin/sh\n[ \"$*\" = 'ps --all --no-trunc --format {{.ID}} {{.State}}' ] || exit 3\n" +
		"printf '%s\\n' 'aaaa running' 'bbbb exited' 'cccc created' 'dddd paused' 'eeee stopped'\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := (&Podman{Command: fake}).List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.IDs) != 3 || !got.IDs["aaaa"] || !got.IDs["cccc"] || !got.IDs["dddd"] {
		t.Errorf("listed %v", got.IDs)
	}
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho 'cannot connect' >&2\nexit 125\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := (&Podman{Command: fake}).List(context.Background()); err == nil || !strings.Contains(err.Error(), "cannot connect") {
		t.Errorf("a failing podman: %v", err)
	}
}

// The CRI lister reads crictl's ready sandboxes; a failing crictl (no
// endpoint) is an error.
func TestCRIListsReadySandboxes(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "crictl")
	script := "#!/bin/sh\n[ \"$*\" = 'pods --state ready --quiet --no-trunc' ] || exit 3\nprintf '%s\\n' 0f1e2d3c4b5a 9a8b7c6d5e4f\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := (&CRI{Command: fake}).List(context.Background())
	if err != nil || len(got.IDs) != 2 || !got.IDs["0f1e2d3c4b5a"] || !got.IDs["9a8b7c6d5e4f"] {
		t.Errorf("listed %v, %v", got, err)
	}
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho 'connect: no such file' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := (&CRI{Command: fake}).List(context.Background()); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("a failing crictl: %v", err)
	}
}

func TestNewRefusesWhatItCannotAsk(t *testing.T) {
	for _, name := range []string{"docker", ""} {
		if _, err := New(name); err == nil {
			t.Errorf("New(%q) succeeded", name)
		}
	}
}
