package doctor

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/runtimes"
)

// HostOptions are the probes of the real host: whether Nomad is installed,
// what each plugin prints when Nomad fingerprints it, whether a directory
// is a tmpfs and how much room it has. The caller adds what to read.
func HostOptions() Options {
	return Options{Nomad: nomadInstalled(), NomadClient: func() NomadClient { return nomadClient(nomadConfigDir) }, Version: pluginVersion, OnTmpfs: onTmpfs, Free: freeRoom, EUID: os.Geteuid(),
		PrometheusRules: PrometheusRules, PrometheusConfig: PrometheusConfig}
}

// nomadConfigDir is where Nomad's packages keep the agent's configuration.
const nomadConfigDir = "/etc/nomad.d"

// nomadClient reads the client's settings from the running agent (its
// API, through the nomad CLI and its NOMAD_ADDR and NOMAD_TOKEN), else
// from the configuration files in configDir (/etc/nomad.d), else takes
// Nomad's defaults; Source says which, and why not the API. The agent's
// version comes from its API, else from `nomad version`, the CLI's own.
func nomadClient(configDir string) NomadClient {
	why := "no nomad CLI in PATH"
	path, err := exec.LookPath("nomad")
	nc, ok := NomadClient{}, false
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		b, err := (&runtimes.Nomad{Command: path}).API(ctx, "/v1/agent/self")
		if err == nil {
			nc, err = parseAgentSelf(b)
			ok = err == nil
		}
		if err != nil {
			why = err.Error()
		}
	}
	if !ok {
		if nc, ok = readNomadConfigDir(configDir); !ok {
			nc = NomadDefaults()
		}
		nc.Source += " (the agent's API: " + why + ")"
	}
	if nc.Version == "" {
		// After the settings: the version decides a default cni_path
		// (Nomad 1.11.2 changed it), which setVersion applies.
		nc.setVersion(nomadCLIVersion(path))
	}
	return nc
}

// nomadCLIVersion is what `nomad version` prints: the agent's version too
// unless the agent runs another binary (one upgraded, not yet restarted).
// Unknown, it returns "" and why.
func nomadCLIVersion(path string) (version, source string) {
	if path == "" {
		return "", "no nomad CLI in PATH"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "version")
	cmd.WaitDelay = time.Second // a child left holding stdout
	out, err := cmd.Output()
	if err == nil {
		version, err = parseNomadVersion(string(out))
	}
	if err != nil {
		return "", fmt.Sprintf("%s version: %v", path, err)
	}
	return version, fmt.Sprintf("%s version, the CLI's: the agent's unless it runs another binary", path)
}

// nomadInstalled: a Nomad binary in PATH or its configuration directory.
func nomadInstalled() bool {
	if _, err := exec.LookPath("nomad"); err == nil {
		return true
	}
	_, err := os.Stat(nomadConfigDir)
	return err == nil
}

// pluginVersion runs a plugin as Nomad's fingerprint does: no arguments,
// stdout and stderr together, a few seconds at most.
func pluginVersion(path string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	cmd.WaitDelay = time.Second // a child left holding its output
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func onTmpfs(dir string) (bool, error) {
	mem, _, err := ipamdir.Dir{DataDir: dir}.OnTmpfs()
	return mem, err
}

// freeRoom is what root may still write under dir (the plugin runs as
// root, so blocks reserved for it count). A filesystem that reports no
// inodes at all (btrfs) allocates them as it goes.
func freeRoom(dir string) (Room, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return Room{}, fmt.Errorf("statfs %s: %w", dir, err)
	}
	// Linux fills f_frsize in from f_bsize where a filesystem leaves it 0.
	r := Room{Bytes: st.Bfree * uint64(st.Frsize), Inodes: st.Ffree}
	if st.Files == 0 {
		r.Inodes = math.MaxUint64
	}
	return r, nil
}
