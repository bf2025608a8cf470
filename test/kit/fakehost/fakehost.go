// Package fakehost is a sysinfo.Host for tests: a fixed boot, a fixed
// clock, namespaces and processes that exist because the test says so.
package fakehost

import (
	"fmt"
	"io/fs"
	"net"
	"os"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

// Host is a settable sysinfo.Host.
type Host struct {
	ID   string
	Boot time.Time
	// BootErr makes BootTime fail: /proc/stat unreadable.
	BootErr error
	Clock   time.Time
	// Ticking, when set, makes the clock run: Now is Clock plus the real
	// time since Ticking.
	Ticking time.Time
	// Namespaces maps a netns path to its identity; a path absent here does
	// not exist, unless it is in NotNetns (exists, but not nsfs).
	Namespaces map[string]sysinfo.NetnsID
	NotNetns   map[string]bool
	// Cookies maps a netns path to its SO_NETNS_COOKIE; absent means the
	// kernel cannot tell (0, error).
	Cookies map[string]uint64
	// Links maps "<netns path> <ifname>" to the link's addresses.
	Links map[string][]net.IP
	// Processes maps a pid to its start time.
	Processes map[int]uint64
	// Holders is what holds each namespace, whatever its path; HolderCookies
	// is the cookie of a held namespace (absent: the kernel cannot tell).
	Holders       sysinfo.Holders
	HolderCookies map[sysinfo.NetnsID]uint64
	// HolderErrs makes confirming a holder of that namespace fail: the
	// namespace cannot be entered.
	HolderErrs map[sysinfo.NetnsID]error
	// HolderScans counts NetnsHolders calls; OnHolderScan, when set, runs
	// at each.
	HolderScans  int
	OnHolderScan func()
	// LockHolders maps a path to the pids that have it open; KillLockHolders
	// kills them (OnKill runs with the path, then they are gone) and
	// records them in Killed.
	LockHolders map[string][]int
	OnKill      func(path string)
	Killed      []int
	// CNIRunning maps a container ID to the pid of a CNI command running
	// for it; CNIScans counts CNIProcesses calls, OnCNIScan runs at each
	// (before the answer is made) and CNIErr makes them fail.
	CNIRunning map[string]int
	CNIScans   int
	OnCNIScan  func()
	CNIErr     error
}

var _ sysinfo.Host = (*Host)(nil)

// HostNetns is the fake host's own network namespace, at /proc/self/ns/net.
var HostNetns = sysinfo.NetnsID{Dev: 4, Ino: 4026531840}

// New returns a host booted at boot with ID "boot-1", the clock an hour
// later, and this process registered as running.
func New(boot time.Time) *Host {
	return &Host{
		ID: "boot-1", Boot: boot, Clock: boot.Add(time.Hour),
		Namespaces: map[string]sysinfo.NetnsID{"/proc/self/ns/net": HostNetns}, NotNetns: map[string]bool{}, Cookies: map[string]uint64{},
		Processes: map[int]uint64{os.Getpid(): 4242},
		Holders:   sysinfo.Holders{}, HolderCookies: map[sysinfo.NetnsID]uint64{}, Links: map[string][]net.IP{},
	}
}

func (h *Host) BootID() (string, error)      { return h.ID, nil }
func (h *Host) BootTime() (time.Time, error) { return h.Boot, h.BootErr }

func (h *Host) Now() time.Time {
	if !h.Ticking.IsZero() {
		return h.Clock.Add(time.Since(h.Ticking))
	}
	return h.Clock
}

func (h *Host) Netns(path string) (sysinfo.NetnsID, error) {
	if id, ok := h.Namespaces[path]; ok {
		return id, nil
	}
	if h.NotNetns[path] {
		return sysinfo.NetnsID{}, fmt.Errorf("%s: %w", path, sysinfo.ErrNotNetns)
	}
	return sysinfo.NetnsID{}, &fs.PathError{Op: "statfs", Path: path, Err: fs.ErrNotExist}
}

func (h *Host) NetnsCookie(path string) (uint64, error) {
	if c, ok := h.Cookies[path]; ok {
		return c, nil
	}
	return 0, fmt.Errorf("no cookie for %s", path)
}

func (h *Host) LinkAddrs(path, ifName string) ([]net.IP, error) {
	return h.Links[path+" "+ifName], nil
}

func (h *Host) ProcessStart(pid int) (uint64, bool) {
	start, ok := h.Processes[pid]
	return start, ok
}

func (h *Host) NetnsHolders() (sysinfo.Holders, error) {
	h.HolderScans++
	if h.OnHolderScan != nil {
		h.OnHolderScan()
	}
	return h.Holders, nil
}

// ConfirmHolder confirms a holder listed in Holders whose namespace has the
// cookie asked for (any, when cookie is 0).
func (h *Host) ConfirmHolder(holder sysinfo.Holder, id sysinfo.NetnsID, cookie uint64) (sysinfo.Holder, bool, error) {
	for _, listed := range h.Holders[id] {
		if listed.PID == holder.PID && listed.Mount == holder.Mount {
			if err := h.HolderErrs[id]; err != nil && cookie != 0 {
				return holder, false, err
			}
			if cookie != 0 && h.HolderCookies[id] != cookie {
				return holder, false, nil
			}
			return listed, true, nil
		}
	}
	return holder, false, nil
}

// KillLockHolders kills the pids listed in LockHolders for path.
func (h *Host) KillLockHolders(path string) ([]int, error) {
	pids := h.LockHolders[path]
	delete(h.LockHolders, path)
	h.Killed = append(h.Killed, pids...)
	if len(pids) > 0 && h.OnKill != nil {
		h.OnKill(path)
	}
	return pids, nil
}

// CNIProcesses answers from CNIRunning.
func (h *Host) CNIProcesses(containerIDs []string) (map[string]int, error) {
	h.CNIScans++
	if h.OnCNIScan != nil {
		h.OnCNIScan()
	}
	if h.CNIErr != nil {
		return nil, h.CNIErr
	}
	found := map[string]int{}
	for _, id := range containerIDs {
		if pid, ok := h.CNIRunning[id]; ok {
			found[id] = pid
		}
	}
	return found, nil
}
