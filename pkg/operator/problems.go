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
	n     int
	err   error
}

// Add keeps one problem.
func (p *Problems) Add(s string) {
	p.n++
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
	b, _ := json.Marshal(s) // one line: newlines are escaped
	if _, err := p.w.Write(append(b, '\n')); err != nil {
		p.err = fmt.Errorf("spool problems: %w", err)
	}
}

// Len is how many problems were added.
func (p *Problems) Len() int { return p.n }

// Each calls fn with every problem, in the order they were added.
func (p *Problems) Each(fn func(string)) error {
	for _, s := range p.mem {
		fn(s)
	}
	if p.err != nil || p.spill == nil {
		return p.err
	}
	if err := p.w.Flush(); err != nil {
		return fmt.Errorf("spool problems: %w", err)
	}
	if _, err := p.spill.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("spool problems: %w", err)
	}
	sc := bufio.NewScanner(p.spill)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		var s string
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			return fmt.Errorf("spool problems: %w", err)
		}
		fn(s)
	}
	return sc.Err()
}

// All returns every problem (tests, and small listings).
func (p *Problems) All() ([]string, error) {
	out := []string{}
	err := p.Each(func(s string) { out = append(out, s) })
	return out, err
}

// Close drops the spill file.
func (p *Problems) Close() {
	if p.spill != nil {
		p.spill.Close()
		p.spill = nil
	}
}
