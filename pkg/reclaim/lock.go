package reclaim

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/disk"
)

// lockedStore opens host-local's store of a network and takes its lock:
// the flock on <dataDir>/<network>/lock that every host-local ADD and DEL
// takes, so nothing here races an allocation. release unlocks and closes;
// unlocking twice is harmless (disk.Store.GC unlocks on return).
func lockedStore(network, dataDir string) (store *disk.Store, release func(), err error) {
	dir := filepath.Join(dataDir, network)
	store, err = disk.New(network, dataDir)
	if err != nil {
		return nil, nil, fmt.Errorf("open host-local store %s: %w", dir, err)
	}
	if err := store.Lock(); err != nil {
		return nil, nil, errors.Join(fmt.Errorf("lock %s: %w", dir, err), store.Close())
	}
	return store, func() {
		store.Unlock()
		store.Close()
	}, nil
}
