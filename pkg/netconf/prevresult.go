package netconf

import (
	"encoding/json"
	"net"
	"slices"
)

// A prevResult is checked by the CNI library's version.ParsePrevResult,
// which decodes it into a generic map, encodes that again and decodes it
// into the result types of the entry's version: in a fresh process the
// reflection behind it costs 0.1–0.2 ms of CHECK's and DEL's own time,
// the largest single step of what the plugin adds to them (BENCHMARKS.md,
// "Own time per verb"). prevResultSurelyValid answers first for the
// results bridge and the runtimes write: it says yes only for a result it
// can see every part of, and anything it does not know (another key, a
// null, a number written as 1e2, a version of another result type) goes
// to ParsePrevResult, whose verdict and error stand. It may say no to a
// valid result; it never says yes to one ParsePrevResult refuses
// (FuzzPrevResultSurelyValid).

// resultShape is what one result type's decoder reads where the types
// differ: the keys of an interface and of an IP config, each with what its
// value must be. A result's own keys, a route's and DNS's are the same in
// both (routeKeys, dnsKeys, topKeys).
type resultShape struct {
	versions        []string
	iface, ipConfig map[string]valueKind
}

type valueKind int

const (
	aString valueKind = iota
	anInt
	anIP
	aCIDR
	stringList
	interfaceList
	ipConfigList
	routeList
	dnsObject
	anInterface
	anIPConfig
	aRoute
)

var (
	routeKeys = map[string]valueKind{"dst": aCIDR, "gw": anIP, "mtu": anInt, "advmss": anInt, "priority": anInt, "table": anInt, "scope": anInt}
	dnsKeys   = map[string]valueKind{"nameservers": stringList, "domain": aString, "search": stringList, "options": stringList}
	topKeys   = map[string]valueKind{"cniVersion": aString, "interfaces": interfaceList, "ips": ipConfigList, "routes": routeList, "dns": dnsObject}

	// types040.Result: 0.3.0, 0.3.1 and 0.4.0 (its IP configs carry
	// "version").
	shape040 = &resultShape{
		versions: []string{"0.3.0", "0.3.1", "0.4.0"},
		iface:    map[string]valueKind{"name": aString, "mac": aString, "sandbox": aString},
		ipConfig: map[string]valueKind{"version": aString, "interface": anInt, "address": aCIDR, "gateway": anIP},
	}
	// types100.Result: 1.0.0 and 1.1.0.
	shape100 = &resultShape{
		versions: []string{"1.0.0", "1.1.0"},
		iface:    map[string]valueKind{"name": aString, "mac": aString, "mtu": anInt, "sandbox": aString, "socketPath": aString, "pciID": aString},
		ipConfig: map[string]valueKind{"interface": anInt, "address": aCIDR, "gateway": anIP},
	}
)

// prevResultSurelyValid reports whether ParsePrevResult is certain to
// accept prev as the prevResult of an entry of cniVersion.
func prevResultSurelyValid(prev json.RawMessage, cniVersion string) bool {
	var shape *resultShape
	for _, s := range []*resultShape{shape040, shape100} {
		if slices.Contains(s.versions, cniVersion) {
			shape = s
		}
	}
	if shape == nil {
		return false
	}
	// ParsePrevResult's generic map also decodes what a repeated key's
	// last value hides, and refuses a number no float64 holds there.
	if !onlySmallInts(prev) {
		return false
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(prev, &top) != nil || top == nil || !shape.object(top, topKeys) {
		return false
	}
	// ParsePrevResult decodes with the entry's version's result type,
	// which takes the result's own "cniVersion" when it has one.
	if v, ok := top["cniVersion"]; ok {
		s, _ := stringOf(v)
		return slices.Contains(shape.versions, s)
	}
	return true
}

// object reports whether every key of m is one of keys with a value of its
// kind. Only exact keys count: encoding/json would also match "IPs" to
// "ips", and what it does with two keys for one field is not ours to
// guess.
func (s *resultShape) object(m map[string]json.RawMessage, keys map[string]valueKind) bool {
	for k, v := range m {
		kind, ok := keys[k]
		if !ok || !s.value(v, kind) {
			return false
		}
	}
	return true
}

func (s *resultShape) value(v json.RawMessage, kind valueKind) bool {
	switch kind {
	case aString:
		_, ok := stringOf(v)
		return ok
	case anInt:
		return isSmallInt(v)
	case anIP:
		str, ok := stringOf(v)
		return ok && net.ParseIP(str) != nil
	case aCIDR:
		str, ok := stringOf(v)
		if !ok {
			return false
		}
		_, _, err := net.ParseCIDR(str)
		return err == nil
	case stringList:
		return s.list(v, aString)
	case interfaceList:
		return s.list(v, anInterface)
	case ipConfigList:
		return s.list(v, anIPConfig)
	case routeList:
		return s.list(v, aRoute)
	case dnsObject:
		return s.objectValue(v, dnsKeys)
	case anInterface:
		return s.objectValue(v, s.iface)
	case anIPConfig:
		return s.objectValue(v, s.ipConfig)
	case aRoute:
		return s.objectValue(v, routeKeys)
	}
	return false
}

// list reports whether v is an array of elem.
func (s *resultShape) list(v json.RawMessage, elem valueKind) bool {
	if len(v) == 0 || v[0] != '[' {
		return false
	}
	var items []json.RawMessage
	if json.Unmarshal(v, &items) != nil {
		return false
	}
	for _, item := range items {
		if !s.value(item, elem) {
			return false
		}
	}
	return true
}

func (s *resultShape) objectValue(v json.RawMessage, keys map[string]valueKind) bool {
	if len(v) == 0 || v[0] != '{' {
		return false
	}
	var m map[string]json.RawMessage
	return json.Unmarshal(v, &m) == nil && s.object(m, keys)
}

// stringOf decodes v if it is a JSON string (not null): json.RawMessage
// values of a decoded object or array carry no surrounding space.
func stringOf(v json.RawMessage) (string, bool) {
	var str string
	if len(v) < 2 || v[0] != '"' || json.Unmarshal(v, &str) != nil {
		return "", false
	}
	return str, true
}

// isSmallInt is an integer literal of at most 9 digits: an int for the
// result types' decoder, and the same integer after the float64 of
// ParsePrevResult's generic map.
func isSmallInt(v json.RawMessage) bool {
	digits := v
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 9 {
		return false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// onlySmallInts reports whether every number in the JSON text v, outside
// its strings, is a small integer (isSmallInt).
func onlySmallInts(v []byte) bool {
	inString, escaped := false, false
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '-' || c >= '0' && c <= '9':
			j := i + 1
			for j < len(v) && (v[j] >= '0' && v[j] <= '9' || v[j] == '.' || v[j] == 'e' || v[j] == 'E' || v[j] == '+' || v[j] == '-') {
				j++
			}
			if !isSmallInt(v[i:j]) {
				return false
			}
			i = j - 1
		}
	}
	return true
}
