package operator

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// problemsInMemory is how many problems a Problems keeps in memory before
// it spills the rest to a temp file.
const problemsInMemory = 1024

// Problems are the files a listing skipped, kept for the end of its
// output without holding them all: the first problemsInMemory in memory,
// the others in a temp file that is unlinked as soon as it is made (a
// data dir of 100 000 planted files held 97 MB of them).
type Problems struct {
	mem   []string
	spill *os.File
	w     *bufio.Writer
	err   error
}

// Add keeps one problem.
func (p *Problems) Add(s string) {
	if len(p.mem) < problemsInMemory {
		p.mem = append(p.mem, s)
		return
	}
	if p.err != nil {
		return
	}
	if p.spill == nil {
		f, err := os.CreateTemp("", "nomad-bridge-cni-problems-*")
		if err != nil {
			p.err = fmt.Errorf("spool problems: %w", err)
			return
		}
		// Unlinked at once: nothing is left behind, even if killed.
		_ = os.Remove(f.Name())
		p.spill, p.w = f, bufio.NewWriter(f)
	}
	if err := json.NewEncoder(p.w).Encode(s); err != nil {
		p.err = fmt.Errorf("spool problems: %w", err)
	}
}

// Each calls fn with every problem, in the order they were added.
func (p *Problems) Each(fn func(string)) error {
	for _, s := range p.mem {
		fn(s)
	}
	if p.err != nil || p.spill == nil {
		return p.err
	}
	err := p.w.Flush()
	if err == nil {
		_, err = p.spill.Seek(0, io.SeekStart)
	}
	dec := json.NewDecoder(p.spill)
	for err == nil {
		var s string
		if err = dec.Decode(&s); err == nil {
			fn(s)
		}
	}
	if err == io.EOF {
		return nil
	}
	return fmt.Errorf("spool problems: %w", err)
}

// Close drops the spill file.
func (p *Problems) Close() {
	if p.spill != nil {
		p.spill.Close()
		p.spill = nil
	}
}
