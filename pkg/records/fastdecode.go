package records

import (
	"math"
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
func decodeFast(b []byte, r *Record) bool {
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
			return p.str(&r.Network)
		case "containerID":
			return p.str(&r.ContainerID)
		case "ifName":
			return p.str(&r.IfName)
		case "netns":
			return p.str(&r.Netns)
		case "bootID":
			return p.str(&r.BootID)
		case "state":
			return p.str((*string)(&r.State))
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
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			raw := p.b[start:p.i]
			return raw, utf8.Valid(raw)
		case c == '\\' || c < 0x20:
			return nil, false
		}
		p.i++
	}
	return nil, false
}

func (p *fastParser) str(v *string) bool {
	raw, ok := p.rawStr()
	if ok {
		*v = string(raw[1 : len(raw)-1])
	}
	return ok
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
