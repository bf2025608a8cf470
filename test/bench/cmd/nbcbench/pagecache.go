package main

import (
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The page-cache state of a binary's file moves its exec cost by several
// per cent with the same bytes: a file the Go linker has just written
// (through a shared mapping) execs slower than a copy of it, and both
// change again once read back from disk (BENCHMARKS.md, "How it measures").
// On a node, /opt/cni/bin is read back from disk after each boot, so every
// binary under test is put in that state before the run: written back and
// dropped from the page cache, to be read in again by its first exec.

// evictFromPageCache writes back each file's dirty pages and drops its
// cached pages. Pages a running process maps stay; nothing under test runs
// yet when the benchmarks start.
func evictFromPageCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fd := int(f.Fd())
	// Dirty pages are not dropped: write them back first.
	if err := unix.Fdatasync(fd); err != nil {
		return fmt.Errorf("fdatasync %s: %w", path, err)
	}
	if err := unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("fadvise %s: %w", path, err)
	}
	return nil
}

// residentPages counts the pages of path in the page cache (mincore over a
// mapping of the whole file) and the file's size in pages.
func residentPages(path string) (resident, total int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	if st.Size() == 0 {
		return 0, 0, nil
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, 0, fmt.Errorf("mmap %s: %w", path, err)
	}
	defer unix.Munmap(m)
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	// x/sys/unix has no wrapper for mincore.
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		return 0, 0, fmt.Errorf("mincore %s: %w", path, e)
	}
	for _, v := range vec {
		resident += int(v & 1)
	}
	return resident, len(vec), nil
}

// evictBinaries evicts every regular file of dir and each of extra, and
// says what it did; a file the kernel kept (tmpfs holds its files in the
// page cache) is named in the note.
func evictBinaries(dir string, extra ...string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	var paths []string
	for _, e := range entries {
		if e.Type().IsRegular() {
			paths = append(paths, filepath.Join(dir, e.Name()))
		}
	}
	for _, p := range extra {
		if p != "" {
			paths = append(paths, p)
		}
	}
	var kept []string
	for _, p := range paths {
		if err := evictFromPageCache(p); err != nil {
			return "", err
		}
		r, n, err := residentPages(p)
		if err != nil {
			return "", err
		}
		if r > 0 {
			kept = append(kept, fmt.Sprintf("%s (%d of %d pages)", filepath.Base(p), r, n))
		}
	}
	note := fmt.Sprintf("the %d binaries under test were written back and dropped from the page cache before the run, so that each is read from disk by its first exec, as /opt/cni/bin is after a boot", len(paths))
	if len(kept) > 0 {
		note += fmt.Sprintf("; still resident (a file system that keeps files in memory?): %v", kept)
	}
	return note, nil
}
