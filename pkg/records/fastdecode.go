package records

import (
	"bytes"
	"math"
	"strings"
	"sync/atomic"
	"unicode/utf8"
)

// decodeFast parses the form Write produces — one JSON object holding only
// Record's own keys, spelled exactly, with plain integers, strings without
// escapes and no nulls — into r, and reports false for anything else, in
// which case the caller decodes with encoding/json. It accepts a strict
// subset of what encoding/json accepts and yields the same Record for it
// (FuzzDecodeFastAgrees checks both), so it changes no outcome; it exists
// because a sweep decodes every record of a network, and reflection-based
// decoding was 40 % of a sweep that finds nothing stale.
//
// known holds strings the record most likely repeats (none in its zero
// value): r then shares them instead of holding copies, which is most of
// what decoding a thousand records allocates. Only memory is shared, never
// a value: a string that differs is copied as without known.
func decodeFast(b []byte, r *Record, known knownStrings) bool {
	cid, ifName, _ := strings.Cut(known.name, "@")
	p := fastParser{b: b}
	return p.object(func(key []byte) bool {
		switch string(key) { // no allocation: a conversion in a switch
		case "version":
			return p.int(&r.Version)
		case "pid":
			return p.int(&r.PID)
		case "netnsCookie":
			return p.uint(&r.NetnsCookie)
		case "pidStart":
			return p.uint(&r.PIDStart)
		case "deadline":
			return p.uint(&r.Deadline)
		case "network":
			return p.strKnown(&r.Network, known.network)
		case "containerID":
			return p.strKnown(&r.ContainerID, cid)
		case "ifName":
			return p.strKnown(&r.IfName, ifName)
		case "netns":
			return p.str(&r.Netns)
		case "bootID":
			return p.strShared(&r.BootID, known.bootID)
		case "state":
			return p.strKnown((*string)(&r.State), string(Complete), string(Started), string(Migrated))
		case "created":
			raw, ok := p.rawStr()
			return ok && r.Created.UnmarshalJSON(raw) == nil
		case "netnsID":
			// A repeated object updates field by field, as in encoding/json.
			return p.object(func(key []byte) bool {
				switch string(key) {
				case "dev":
					return p.uint(&r.NetnsID.Dev)
				case "ino":
					return p.uint(&r.NetnsID.Ino)
				}
				return false
			})
		case "ips":
			return p.strs(&r.IPs)
		case "legacyLeases":
			return p.strs(&r.LegacyLeases)
		}
		return false
	}) && p.end()
}

// knownStrings are the strings a record decoded in a walk most likely
// holds: its network's name, its file name's parts, and the boot ID of
// the records decoded before it (most are from this boot).
type knownStrings struct {
	network string
	// name is the record's file name, "<containerID>@<ifname>".
	name string
	// bootID is the boot ID last decoded in the walk, shared by its
	// readers (nil: none is shared).
	bootID *atomic.Pointer[string]
}

type fastParser struct {
	b []byte
	i int
}

func (p *fastParser) skipSpace() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// byte consumes c, after optional whitespace, if it comes next.
func (p *fastParser) byte(c byte) bool {
	p.skipSpace()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// object parses {"key":value,...}, calling field with each key (without
// its quotes) to parse the value that follows.
func (p *fastParser) object(field func(key []byte) bool) bool {
	if !p.byte('{') {
		return false
	}
	if p.byte('}') {
		return true
	}
	for {
		key, ok := p.rawStr()
		if !ok || !p.byte(':') || !field(key[1:len(key)-1]) {
			return false
		}
		if p.byte('}') {
			return true
		}
		if !p.byte(',') {
			return false
		}
	}
}

func (p *fastParser) end() bool {
	p.skipSpace()
	return p.i == len(p.b)
}

// rawStr returns a string literal with its quotes, if it has no escape,
// no control character and is valid UTF-8 (encoding/json would rewrite
// invalid UTF-8, so leave that to it).
func (p *fastParser) rawStr() ([]byte, bool) {
	if !p.byte('"') {
		return nil, false
	}
	start := p.i - 1
	end := bytes.IndexByte(p.b[p.i:], '"')
	if end < 0 {
		return nil, false
	}
	ascii := true
	for _, c := range p.b[p.i : p.i+end] {
		if c < 0x20 || c == '\\' {
			return nil, false
		}
		ascii = ascii && c < utf8.RuneSelf
	}
	p.i += end + 1
	raw := p.b[start:p.i]
	return raw, ascii || utf8.Valid(raw)
}

func (p *fastParser) str(v *string) bool {
	raw, ok := p.rawStr()
	if ok {
		*v = string(raw[1 : len(raw)-1])
	}
	return ok
}

// strKnown is str that takes the string from known when it is one of
// them: no copy.
func (p *fastParser) strKnown(v *string, known ...string) bool {
	raw, ok := p.rawStr()
	if !ok {
		return false
	}
	body := raw[1 : len(raw)-1]
	for _, k := range known {
		if k != "" && string(body) == k { // no allocation: a comparison
			*v = k
			return true
		}
	}
	*v = string(body)
	return true
}

// strShared is str that takes the string last stored in last when it is
// the same, and else stores the one it makes there for the next.
func (p *fastParser) strShared(v *string, last *atomic.Pointer[string]) bool {
	if last == nil {
		return p.str(v)
	}
	raw, ok := p.rawStr()
	if !ok {
		return false
	}
	body := raw[1 : len(raw)-1]
	if prev := last.Load(); prev != nil && string(body) == *prev {
		*v = *prev
		return true
	}
	s := string(body)
	last.Store(&s)
	*v = s
	return true
}

// digits consumes an integer literal — an optional '-' when signed, then 0
// or [1-9][0-9]*, with no fraction or exponent following — and returns its
// sign and magnitude; false also on overflow of a uint64.
func (p *fastParser) digits(signed bool) (neg bool, n uint64, ok bool) {
	p.skipSpace()
	if signed && p.i < len(p.b) && p.b[p.i] == '-' {
		neg = true
		p.i++
	}
	first := p.i
	for ; p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9'; p.i++ {
		d := uint64(p.b[p.i] - '0')
		if n > (math.MaxUint64-d)/10 {
			return false, 0, false
		}
		n = n*10 + d
	}
	count := p.i - first
	if count == 0 || (count > 1 && p.b[first] == '0') {
		return false, 0, false
	}
	if p.i < len(p.b) {
		switch p.b[p.i] {
		case '.', 'e', 'E', '-', '+':
			return false, 0, false
		}
	}
	return neg, n, true
}

func (p *fastParser) int(v *int) bool {
	neg, n, ok := p.digits(true)
	switch {
	case !ok:
		return false
	case neg && n <= -math.MinInt:
		*v = int(-n)
	case !neg && n <= math.MaxInt:
		*v = int(n)
	default:
		return false
	}
	return true
}

func (p *fastParser) uint(v *uint64) bool {
	_, n, ok := p.digits(false)
	*v = n
	return ok
}

// strs reads an array of strings; like encoding/json, it replaces what the
// slice held, and [] gives an empty, non-nil slice.
func (p *fastParser) strs(v *[]string) bool {
	if !p.byte('[') {
		return false
	}
	out := []string{}
	if p.byte(']') {
		*v = out
		return true
	}
	for {
		var s string
		if !p.str(&s) {
			return false
		}
		out = append(out, s)
		if p.byte(']') {
			*v = out
			return true
		}
		if !p.byte(',') {
			return false
		}
	}
}
