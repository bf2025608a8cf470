package netfilter

import (
	"errors"
	"fmt"
)

// A sweep releases a container's NAT rules while its runtime may be
// running a DEL of it: its namespace died, the sweep found it stale, and
// the runtime's DEL runs the chain's plugins, portmap first. portmap's
// teardown cannot bear its chain vanishing under it: it checks the chain
// exists, flushes it, deletes it, and fails the DEL if either finds it
// gone (chain.teardown and go-iptables' ClearAndDeleteChain). The first
// time it deletes the chain fails while the CNI-HOSTPORT-DNAT jump to it
// is there; it deletes that jump itself and runs those three steps again.
//
// Emptying the chain and deleting its jump never fail portmap: its flush
// and delete of an empty, unreferenced chain succeed. Only deleting the
// chain can, and only a teardown that began before its jump went (it is
// then in its second round). So a sweep asks which containers a CNI
// command runs for (Cleaner.Running) before it touches a container's
// portmap chain, and leaves the whole container to the command; then
// deletes the jumps and empties the chain; then asks again, and deletes
// the emptied chain only of a container nothing runs for: a teardown
// that begins after that question finds no jump, and its first round
// succeeds or finds the chain gone.

// BusyError says that a CNI command of the container runs (its runtime's
// DEL, say), so the sweep left the container's portmap chain to it.
type BusyError struct {
	ContainerID string
	// PID is a process of the command; 0 when the processes could not be
	// read (Err), which proves nothing either way.
	PID int
	Err error
	// Emptied: its jumps went and the chain was emptied before the
	// command was found; only the chain is left.
	Emptied bool
}

func (e *BusyError) Error() string {
	what := "its NAT rules are"
	if e.Emptied {
		what = "portmap's chain, emptied, is"
	}
	if e.Err != nil {
		return fmt.Sprintf("whether a CNI command of %s runs is unknown (%v): %s left for the next sweep", e.ContainerID, e.Err, what)
	}
	return fmt.Sprintf("a CNI command of %s runs (pid %d): %s left to it", e.ContainerID, e.PID, what)
}

// releaseAsked is iptablesRules.Release in a sweep: the containers a CNI
// command runs for keep what portmap's teardown needs (see above), each
// failed with a *BusyError. Bridge's POSTROUTING jump and chain go last:
// its commented jump is what names a container that has no record (an
// orphan) to the next sweep, so while portmap's chain is still there, so
// is the jump (a kill, or a command found the second time, leaves both).
func (r iptablesRules) releaseAsked(owners []string) (map[string][]string, map[string]error) {
	removed, failed := map[string][]string{}, map[string]error{}
	busy := r.running(r.snap.withPortmapChain(owners), false)
	var emptied []string
	emptiedIn := map[string][]int{}
	for _, cid := range owners {
		if b, ok := busy[cid]; ok {
			failed[cid] = b
			continue
		}
		gone, families, err := r.snap.emptyPortmap(cid)
		removed[cid] = gone
		if err != nil {
			failed[cid] = err
			continue
		}
		emptied = append(emptied, cid)
		emptiedIn[cid] = families
	}
	busy = r.running(r.snap.withPortmapChain(emptied), true)
	for _, cid := range emptied {
		if b, ok := busy[cid]; ok {
			failed[cid] = b
			continue
		}
		gone, err := r.snap.deletePortmapChains(cid, emptiedIn[cid])
		removed[cid] = append(removed[cid], gone...)
		if err != nil {
			failed[cid] = err
			continue
		}
		gone, err = r.snap.releaseBridge(cid)
		removed[cid] = append(removed[cid], gone...)
		if err != nil {
			failed[cid] = err
		}
	}
	return removed, failed
}

// running asks Cleaner.Running about cids; a failed question makes every
// one of them busy.
func (r iptablesRules) running(cids []string, emptied bool) map[string]*BusyError {
	busy := map[string]*BusyError{}
	if len(cids) == 0 {
		return busy
	}
	pids, err := r.c.Running(cids)
	for _, cid := range cids {
		switch pid, ok := pids[cid]; {
		case err != nil:
			busy[cid] = &BusyError{ContainerID: cid, Err: err, Emptied: emptied}
		case ok:
			busy[cid] = &BusyError{ContainerID: cid, PID: pid, Emptied: emptied}
		}
	}
	return busy
}

// withPortmapChain are the owners with a portmap chain in some family.
func (s *Snapshot) withPortmapChain(owners []string) []string {
	var out []string
	for _, cid := range owners {
		dn := chainNameWithPrefix(s.network, cid, portmapDNPrefix)
		for _, fs := range s.perFamily {
			if fs.chains[dn] {
				out = append(out, cid)
				break
			}
		}
	}
	return out
}

// emptyPortmap deletes containerID's jumps to portmap's chain and empties
// that chain, in every family; it returns what went and the families
// (indexes) whose chain is left, emptied.
func (s *Snapshot) emptyPortmap(containerID string) (removed []string, emptied []int, err error) {
	var errs []error
	dn := chainNameWithPrefix(s.network, containerID, portmapDNPrefix)
	for i, fs := range s.perFamily {
		removed = append(removed, deleteJumps(fs, containerID, hostportDNAT, &errs)...)
		if !fs.chains[dn] {
			continue
		}
		switch err := fs.table.FlushChain(natTableName, dn); {
		case isNotExist(err):
			delete(fs.chains, dn) // its own teardown won
			removed = append(removed, "chain "+dn)
		case err != nil:
			errs = append(errs, fmt.Errorf("empty chain %s of %s: %w", dn, containerID, err))
		default:
			emptied = append(emptied, i)
		}
	}
	return removed, emptied, errors.Join(errs...)
}

// releaseBridge deletes containerID's POSTROUTING jumps and bridge's chain,
// in every family.
func (s *Snapshot) releaseBridge(containerID string) ([]string, error) {
	var removed []string
	var errs []error
	masq := chainName(s.network, containerID)
	for _, fs := range s.perFamily {
		removed = append(removed, deleteJumps(fs, containerID, postrouting, &errs)...)
		if !fs.chains[masq] {
			continue
		}
		if err := fs.table.ClearAndDeleteChain(natTableName, masq); err != nil && !isNotExist(err) {
			errs = append(errs, fmt.Errorf("delete chain %s of %s: %w", masq, containerID, err))
			continue
		}
		delete(fs.chains, masq)
		removed = append(removed, "chain "+masq)
	}
	return removed, errors.Join(errs...)
}

// deleteJumps deletes containerID's listed jumps from chain in fs, and
// forgets them; errors are added to errs.
func deleteJumps(fs familySnapshot, containerID, chain string, errs *[]error) []string {
	var removed []string
	kept := fs.jumps[containerID][:0]
	for _, r := range fs.jumps[containerID] {
		if r.chain != chain {
			kept = append(kept, r)
			continue
		}
		if err := r.table.Delete(natTableName, r.chain, r.spec...); err != nil && !isNotExist(err) {
			*errs = append(*errs, fmt.Errorf("delete jump from %s for %s: %w", r.chain, containerID, err))
			kept = append(kept, r)
			continue
		}
		removed = append(removed, "jump in "+r.chain)
	}
	if len(kept) == 0 {
		delete(fs.jumps, containerID)
	} else {
		fs.jumps[containerID] = kept
	}
	return removed
}

// deletePortmapChains deletes containerID's emptied portmap chain in the
// families given.
func (s *Snapshot) deletePortmapChains(containerID string, families []int) ([]string, error) {
	var removed []string
	var errs []error
	dn := chainNameWithPrefix(s.network, containerID, portmapDNPrefix)
	for _, i := range families {
		fs := s.perFamily[i]
		if err := fs.table.DeleteChain(natTableName, dn); err != nil && !isNotExist(err) {
			errs = append(errs, fmt.Errorf("delete chain %s of %s: %w", dn, containerID, err))
			continue
		}
		delete(fs.chains, dn)
		removed = append(removed, "chain "+dn)
	}
	return removed, errors.Join(errs...)
}
