package main

import "testing"

// A plugin (pid 100, a thread 101) runs bridge (its os/exec child 102),
// which runs host-local (103); a process that began before the trace
// (pid 50) runs another plugin outside every window.
const schedScript = `   50 10.000000000: sched:sched_process_fork: comm=driver pid=50 child_comm=driver child_pid=100
  100 10.001000000: sched:sched_process_exec: filename=/bin/plugin pid=100 old_pid=100
  100 10.001500000: sched:sched_process_fork: comm=plugin pid=100 child_comm=plugin child_pid=101
  101 10.002000000: sched:sched_process_fork: comm=plugin pid=101 child_comm=plugin child_pid=102
  102 10.002500000: sched:sched_process_exec: filename=/bin/bridge pid=102 old_pid=102
  102 10.003000000: sched:sched_process_fork: comm=bridge pid=102 child_comm=bridge child_pid=103
  103 10.003500000: sched:sched_process_exec: filename=/bin/host-local pid=103 old_pid=103
  103 10.004500000: sched:sched_process_exit: comm=host-local pid=103 prio=120 group_dead=true
  102 10.006500000: sched:sched_process_exit: comm=bridge pid=102 prio=120 group_dead=true
  100 10.007000000: sched:sched_process_exit: comm=plugin pid=100 prio=120 group_dead=false
  101 10.007250000: sched:sched_process_exit: comm=plugin pid=101 prio=120 group_dead=true
   50 20.000000000: sched:sched_process_exec: filename=/bin/plugin pid=50 old_pid=50
   50 20.001000000: sched:sched_process_exit: comm=plugin pid=50 prio=120 group_dead=true
`

func TestOwnTimeIsLifetimeMinusTheDelegates(t *testing.T) {
	procs, err := parseSchedScript([]byte(schedScript))
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) != 4 {
		t.Fatalf("%d processes, want 4 (plugin, bridge, host-local, the later plugin): %+v", len(procs), procs)
	}
	if procs[1].parent != 0 || procs[2].parent != 1 || procs[0].parent != -1 {
		t.Errorf("parents %d %d %d, want -1 0 1", procs[0].parent, procs[1].parent, procs[2].parent)
	}
	// The plugin lives 6.25 ms (to its last thread's exit), bridge 4 ms.
	own := ownTimes(procs, "/bin/plugin", "bridge", [][2]int64{{10_000_000_000, 10_010_000_000}, {30e9, 31e9}})
	if len(own) != 1 {
		t.Fatalf("own times %v, want one for the first window only", own)
	}
	if got := own[0].ms; got < 2.2499 || got > 2.2501 {
		t.Errorf("own time %.4f ms, want 2.25 (6.25 alive, 4 in bridge)", got)
	}
	// Two plugin processes in one window: which is the verb's is unknown.
	if own := ownTimes(procs, "/bin/plugin", "bridge", [][2]int64{{0, 30e9}}); len(own) != 0 {
		t.Errorf("own times %v for a window with two plugin processes, want none", own)
	}
}

func TestParseSchedScriptRefusesAnotherFormat(t *testing.T) {
	if _, err := parseSchedScript([]byte("plugin 100 [001] 10.000001: sched:sched_process_exec: filename=/x pid=100\n")); err == nil {
		t.Error("a line without tid and ns time was taken")
	}
}

// A CHECK that sweeps runs iptables itself: that is the plugin's own cost,
// so only the delegate's lifetime comes off.
const schedScriptOwnChild = `  100 10.001000000: sched:sched_process_exec: filename=/bin/plugin pid=100 old_pid=100
  100 10.001500000: sched:sched_process_fork: comm=plugin pid=100 child_comm=plugin child_pid=102
  102 10.002000000: sched:sched_process_exec: filename=/opt/cni/bin/bridge pid=102 old_pid=102
  102 10.005000000: sched:sched_process_exit: comm=bridge pid=102 prio=120 group_dead=true
  100 10.005500000: sched:sched_process_fork: comm=plugin pid=100 child_comm=plugin child_pid=104
  104 10.006000000: sched:sched_process_exec: filename=/usr/sbin/iptables pid=104 old_pid=104
  104 10.008000000: sched:sched_process_exit: comm=iptables pid=104 prio=120 group_dead=true
  100 10.009000000: sched:sched_process_exit: comm=plugin pid=100 prio=120 group_dead=true
`

func TestOwnTimeKeepsThePluginsOwnChildren(t *testing.T) {
	procs, err := parseSchedScript([]byte(schedScriptOwnChild))
	if err != nil {
		t.Fatal(err)
	}
	own := ownTimes(procs, "/bin/plugin", "bridge", [][2]int64{{10e9, 11e9}})
	// Alive 8 ms, 3 of them in bridge; iptables' 2 ms are the plugin's.
	if got := own[0].ms; got < 4.9999 || got > 5.0001 {
		t.Errorf("own time %.4f ms, want 5 (8 alive, 3 in bridge, iptables counted)", got)
	}
	if got := own[0].others; len(got) != 1 || got[0] != "iptables" {
		t.Errorf("other processes %q, want [iptables]", got)
	}
}
