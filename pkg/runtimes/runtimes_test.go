package runtimes

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// The Nomad lister asks the local agent through the nomad CLI (which
// reads NOMAD_ADDR, NOMAD_TOKEN and TLS as it always does), here a
// stand-in answering with recorded API responses: the node's pending,
// running and unknown allocations are listed, the others not; an error of the CLI (a
// refused token, no agent) is an error, never an empty list.
func TestNomadListsTheNodesLiveAllocations(t *testing.T) {
	const node = "f7b9a5e2-1c3d-4e5f-8a9b-0c1d2e3f4a5b"
	dir := t.TempDir()
	// Recorded from a Nomad client agent (trimmed).
	self := `{"config":{"Client":{"Enabled":true}},"member":{"Name":"nbc"},"stats":{"client":{"node_id":"` + node + `","known_servers":"127.0.0.1:4647","num_allocations":"4"},"nomad":{"server":"true"}}}`
	allocs := `[{"ID":"0dc525f4-c491-7e25-a67d-0121069ad55e","ClientStatus":"running","DesiredStatus":"run"},
 {"ID":"7f3b9a2e-51c4-4d0b-9e1a-2c6d8f4e0b17","ClientStatus":"pending","DesiredStatus":"run"},
 {"ID":"9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d","ClientStatus":"unknown","DesiredStatus":"run"},
 {"ID":"c0a1c0a1-0000-4000-8000-00000000c0de","ClientStatus":"complete","DesiredStatus":"stop"},
 {"ID":"5e1f0c2d-6a7b-4c8d-9e0f-1a2b3c4d5e61","ClientStatus":"lost","DesiredStatus":"stop"}]`
	for name, body := range map[string]string{"self.json": self, "allocs.json": allocs} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fake := filepath.Join(dir, "nomad")
	script := "#!/bin/sh\n" +
		"[ \"$NOMAD_TOKEN\" = secret ] || { echo 'Error: Unexpected response code: 403 (Permission denied)' >&2; exit 1; }\n" +
		"case \"$*\" in\n" +
		"'operator api /v1/agent/self') cat " + filepath.Join(dir, "self.json") + " ;;\n" +
		"'operator api /v1/node/" + node + "/allocations') cat " + filepath.Join(dir, "allocs.json") + " ;;\n" +
		"*) echo \"unexpected: $*\" >&2; exit 2 ;;\nesac\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NOMAD_TOKEN", "secret")
	got, err := (&Nomad{Command: fake}).List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// An unknown one is on a client that was disconnected (Nomad's
	// disconnect.lost_after): its tasks may well run on here.
	if len(got.IDs) != 3 || !got.IDs["0dc525f4-c491-7e25-a67d-0121069ad55e"] || !got.IDs["7f3b9a2e-51c4-4d0b-9e1a-2c6d8f4e0b17"] || !got.IDs["9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"] {
		t.Errorf("listed %v, want the running, the pending and the unknown allocation", got.IDs)
	}

	t.Setenv("NOMAD_TOKEN", "wrong")
	if _, err := (&Nomad{Command: fake}).List(context.Background()); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("with a wrong token: %v, want the 403", err)
	}
	if _, err := (&Nomad{Command: filepath.Join(dir, "no-nomad")}).List(context.Background()); err == nil {
		t.Error("no nomad CLI listed nothing without an error")
	}
	if l, err := New("nomad"); err != nil || l.(*Nomad).Command != "nomad" {
		t.Errorf("New(nomad) = %v, %v", l, err)
	}
}

// The podman lister reads podman ps: what has exited (or stopped) is not
// listed; a failing podman is an error, and so is output that is not a
// listing. The stand-in answers as podman 4.3.1 does (recorded): its
// {{.State}} is the human-readable status ("Exited (0) 5 minutes ago"),
// its JSON the container's state. Regression: the lister read {{.State}},
// so every exited container read as listed, and an attachment a stopped
// container's failed clean-up left was never released on podman's account.
func TestPodmanListsWhatIsNotExited(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "podman")
	const id = "c6d84abac9304217cbdd58f959525512946c0042a7c5bf44fdd115f4b09f97"
	listing := `[{"Id":"` + id + `aa","State":"running","Status":"Up 8 seconds ago","IsInfra":false},
 {"Id":"` + id + `bb","State":"exited","Status":"Exited (0) 5 minutes ago","IsInfra":false},
 {"Id":"` + id + `cc","State":"created","Status":"Created","IsInfra":false},
 {"Id":"` + id + `dd","State":"paused","Status":"Paused","IsInfra":true},
 {"Id":"` + id + `ee","State":"stopped","Status":"Exited (137) 2 seconds ago","IsInfra":false}]`
	script := "#!/bin/sh\ncase \"$*\" in\n" +
		"'ps --all --no-trunc --format json') cat <<'EOF'\n" + listing + "\nEOF\n;;\n" +
		"'ps --all --no-trunc --format {{.ID}} {{.State}}') printf '%s\\n' '" + id + "aa Up 8 seconds ago' '" + id + "bb Exited (0) 5 minutes ago' '" +
		id + "cc Created' '" + id + "dd Paused' '" + id + "ee Exited (137) 2 seconds ago' ;;\n" +
		"*) exit 3 ;;\nesac\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := (&Podman{Command: fake}).List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.IDs) != 3 || !got.IDs[id+"aa"] || !got.IDs[id+"cc"] || !got.IDs[id+"dd"] {
		t.Errorf("listed %v, want the running, the created and the paused container", got.IDs)
	}
	for body, why := range map[string]string{"#!/bin/sh\necho 'cannot connect' >&2\nexit 125\n": "cannot connect", "#!/bin/sh\n": "", "#!/bin/sh\necho null\n": ""} {
		if err := os.WriteFile(fake, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := (&Podman{Command: fake}).List(context.Background()); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("podman running %q: %v, want an error", body, err)
		}
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

// A runtime's CLI that leaves a child holding its output open does not
// keep gc --runtime waiting past its context (regression: it waited for
// the child to exit).
func TestOutputDoesNotWaitForTheCLIsChildren(t *testing.T) {
	cli := filepath.Join(t.TempDir(), "podman")
	testhost.ScriptLeavingAChild(t, cli, "abc")
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, _ = output(ctx, cli)
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("output took %v", took)
	}
}
