package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
)

// What a run of a plugin binary (test/kit/cniexec) is given, and the CNI
// error a failed run must print.

// cniArgs is what a runtime passes a plugin for ns's eth0: the bin dir as
// CNI_PATH, no CNI_ARGS.
func (e *testEnv) cniArgs(command string, ns netns) invoke.Args {
	return invoke.Args{Command: command, ContainerID: ns.cid, NetNS: ns.path, IfName: ifName, Path: e.bin}
}

// binary is the path of a binary of the bin dir.
func (e *testEnv) binary(name string) string { return filepath.Join(e.bin, name) }

// cniErrorObj is the error object a CNI plugin prints on stdout.
type cniErrorObj struct {
	Code    *int   `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details"`
}

func (c cniErrorObj) code() int {
	if c.Code == nil {
		return -1
	}
	return *c.Code
}

// parseCNIError requires stdout to be exactly one JSON object, a CNI error
// with a code and a message, and nothing after it.
func parseCNIError(stdout string) (cniErrorObj, error) {
	dec := json.NewDecoder(strings.NewReader(stdout))
	var ce cniErrorObj
	if err := dec.Decode(&ce); err != nil {
		return ce, fmt.Errorf("stdout is not a JSON CNI error: %w", err)
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return ce, fmt.Errorf("stdout holds more than one JSON value (next: %s, %v)", extra, err)
	}
	if ce.Code == nil {
		return ce, errors.New("CNI error without a code")
	}
	if ce.Msg == "" {
		return ce, errors.New("CNI error without a msg")
	}
	return ce, nil
}

// assertCNIFailure checks a run that must fail: exit status non-zero (not
// killed), no panic, and stdout a single CNI error whose code is one of
// codes. It returns the error (zero when stdout held none); the caller
// goes on to check the state either way.
func assertCNIFailure(t *testing.T, r cniexec.Result, codes ...int) cniErrorObj {
	t.Helper()
	assertNoPanic(t, r)
	if r.Killed {
		t.Errorf("the plugin did not return within its guard timeout (%v) and was killed\n%s", r.Elapsed.Round(time.Millisecond), r)
	}
	if r.ExitCode == 0 {
		t.Errorf("exit status 0, want non-zero\n%s", r)
	}
	if r.Signal != 0 {
		t.Errorf("killed by %v, want a normal non-zero exit\n%s", r.Signal, r)
	}
	ce, err := parseCNIError(r.Stdout)
	if err != nil {
		t.Errorf("%v\n%s", err, r)
		return ce
	}
	if !slices.Contains(codes, ce.code()) {
		t.Errorf("CNI error code %d, want %v: msg %q details %q", ce.code(), codes, ce.Msg, ce.Details)
	}
	return ce
}

// assertNoPanic fails when the Go runtime printed a panic or a goroutine
// dump.
func assertNoPanic(t *testing.T, r cniexec.Result) {
	t.Helper()
	for _, s := range []string{r.Stdout, r.Stderr} {
		if strings.Contains(s, "panic:") || strings.Contains(s, "goroutine ") {
			t.Errorf("the plugin panicked:\n%s", r)
			return
		}
	}
}

// k8sArgs are the CNI_ARGS containerd's CRI plugin (and CRI-O's ocicni)
// pass for a pod sandbox.
func k8sArgs(t *testing.T, cid string) [][2]string {
	return [][2]string{
		{"IgnoreUnknown", "1"},
		{"K8S_POD_NAMESPACE", "default"},
		{"K8S_POD_NAME", "web-" + cid[:8]},
		{"K8S_POD_INFRA_CONTAINER_ID", cid},
		{"K8S_POD_UID", podUID(t)},
	}
}
