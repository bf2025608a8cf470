package netfilter

import (
	"errors"
	"fmt"
	"slices"
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

// Release releases owners' iptables rules: portmap's jumps, then its
// chains, then bridge's jumps and chains (a chain cannot be deleted while
// referenced). In a sweep the containers a CNI command runs for keep what
// portmap's teardown needs (see above), each failed with a *BusyError.
// Bridge's POSTROUTING jump and chain go last: its commented rules, the
// jump and then those in its chain (listNAT), are what name a container
// that has no record (an orphan) to the next sweep, so while portmap's
// chain is still there, so is the jump (a kill, a failure, or a command
// found the second time, leaves both).
func (r *iptablesRules) Release(owners []string) (map[string][]string, map[string]error) {
	removed, failed := map[string][]string{}, map[string]error{}
	busy := r.busy(owners, false)
	var emptied []string
	for _, cid := range owners {
		if b, ok := busy[cid]; ok {
			failed[cid] = b
			continue
		}
		gone, err := r.emptyPortmap(cid)
		removed[cid] = gone
		if err != nil {
			failed[cid] = err
			continue
		}
		emptied = append(emptied, cid)
	}
	busy = r.busy(emptied, true)
	for _, cid := range emptied {
		if b, ok := busy[cid]; ok {
			failed[cid] = b
			continue
		}
		gone, err := r.deleteChains(r.portmapChain(cid), cid, Table.DeleteChain)
		removed[cid] = append(removed[cid], gone...)
		if err != nil {
			failed[cid] = err
			continue
		}
		gone, err = r.releaseBridge(cid)
		removed[cid] = append(removed[cid], gone...)
		if err != nil {
			failed[cid] = err
		}
	}
	return removed, failed
}

// busy asks Cleaner.Running about the owners with a portmap chain in some
// family, unless nobody is to be asked; a failed question makes every one
// of them busy.
func (r *iptablesRules) busy(owners []string, emptied bool) map[string]*BusyError {
	busy := map[string]*BusyError{}
	var cids []string
	for _, cid := range owners {
		if slices.ContainsFunc(r.families, func(fr familyRules) bool { return fr.chains[r.portmapChain(cid)] }) {
			cids = append(cids, cid)
		}
	}
	if len(cids) == 0 || r.running == nil {
		return busy
	}
	pids, err := r.running(cids)
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

// emptyPortmap deletes containerID's jumps to portmap's chain and empties
// that chain, in every family. A chain it empties stays listed, one found
// gone (its own teardown won) does not.
func (r *iptablesRules) emptyPortmap(containerID string) ([]string, error) {
	var removed []string
	var errs []error
	dn := r.portmapChain(containerID)
	for _, fr := range r.families {
		// Its jumps whose comment portmap cut are its own too.
		fr.jumps[containerID] = append(fr.jumps[containerID], fr.cut[dn]...)
		delete(fr.cut, dn)
		removed = append(removed, fr.deleteJumps(containerID, hostportDNAT, &errs)...)
		if !fr.chains[dn] {
			continue
		}
		switch err := fr.table.FlushChain(natTableName, dn); {
		case isNotExist(err):
			delete(fr.chains, dn)
			removed = append(removed, "chain "+dn)
		case err != nil:
			errs = append(errs, fmt.Errorf("empty chain %s of %s: %w", dn, containerID, err))
		}
	}
	return removed, errors.Join(errs...)
}

// releaseBridge deletes containerID's POSTROUTING jumps, then bridge's
// chain, in every family.
func (r *iptablesRules) releaseBridge(containerID string) ([]string, error) {
	var removed []string
	var errs []error
	for _, fr := range r.families {
		removed = append(removed, fr.deleteJumps(containerID, postrouting, &errs)...)
	}
	gone, err := r.deleteChains(chainName(r.network, containerID), containerID, Table.ClearAndDeleteChain)
	return append(removed, gone...), errors.Join(append(errs, err)...)
}

// deleteChains deletes chain with del (Table.DeleteChain, which needs it
// empty, or Table.ClearAndDeleteChain) in every family that lists it, and
// forgets it. A chain already gone is no error.
func (r *iptablesRules) deleteChains(chain, containerID string, del func(Table, string, string) error) ([]string, error) {
	var removed []string
	var errs []error
	for _, fr := range r.families {
		if !fr.chains[chain] {
			continue
		}
		if err := del(fr.table, natTableName, chain); err != nil && !isNotExist(err) {
			errs = append(errs, fmt.Errorf("delete chain %s of %s: %w", chain, containerID, err))
			continue
		}
		delete(fr.chains, chain)
		removed = append(removed, "chain "+chain)
	}
	return removed, errors.Join(errs...)
}

// deleteJumps deletes containerID's listed jumps from chain, and forgets
// them; errors are added to errs.
func (fr familyRules) deleteJumps(containerID, chain string, errs *[]error) []string {
	var removed []string
	kept := fr.jumps[containerID][:0]
	for _, j := range fr.jumps[containerID] {
		if j.chain != chain {
			kept = append(kept, j)
			continue
		}
		if err := fr.table.Delete(natTableName, j.chain, j.spec...); err != nil && !isNotExist(err) {
			*errs = append(*errs, fmt.Errorf("delete jump from %s for %s: %w", j.chain, containerID, err))
			kept = append(kept, j)
			continue
		}
		removed = append(removed, "jump in "+j.chain)
	}
	if len(kept) == 0 {
		delete(fr.jumps, containerID)
	} else {
		fr.jumps[containerID] = kept
	}
	return removed
}
