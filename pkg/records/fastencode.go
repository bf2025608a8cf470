package records

import (
	"encoding/json"
	"strconv"
)

// encode is json.Marshal(r), byte for byte (FuzzEncodeAgrees checks it),
// written without reflection for the records nearly all are: strings of
// printable ASCII that encoding/json writes as they are. Anything else
// (a string it would escape, a time it refuses) goes to encoding/json.
// An ADD writes its record twice; encoding/json's first Marshal of a
// Record builds its encoder by reflection, most of what the first write
// cost a process that lives for one verb.
func encode(r *Record) ([]byte, error) {
	b, ok := appendRecord(make([]byte, 0, 512), r)
	if !ok {
		return json.Marshal(r)
	}
	return b, nil
}

// appendRecord appends r as encoding/json would, in Record's field order
// with its omitempty rules; ok is false for what it does not write itself.
func appendRecord(b []byte, r *Record) (_ []byte, ok bool) {
	b = append(b, `{"version":`...)
	b = strconv.AppendInt(b, int64(r.Version), 10)
	for _, f := range [...]struct {
		key, value string
	}{{`,"network":`, r.Network}, {`,"containerID":`, r.ContainerID}, {`,"ifName":`, r.IfName}, {`,"netns":`, r.Netns}} {
		if b, ok = appendPlainString(append(b, f.key...), f.value); !ok {
			return nil, false
		}
	}
	b = append(b, `,"netnsID":{"dev":`...)
	b = strconv.AppendUint(b, r.NetnsID.Dev, 10)
	b = append(b, `,"ino":`...)
	b = strconv.AppendUint(b, r.NetnsID.Ino, 10)
	b = append(b, '}')
	b = appendUintField(b, `,"netnsCookie":`, r.NetnsCookie)
	if b, ok = appendPlainString(append(b, `,"bootID":`...), r.BootID); !ok {
		return nil, false
	}
	created, err := r.Created.MarshalJSON()
	if err != nil {
		return nil, false
	}
	b = append(append(b, `,"created":`...), created...)
	if b, ok = appendPlainString(append(b, `,"state":`...), string(r.State)); !ok {
		return nil, false
	}
	if r.PID != 0 {
		b = strconv.AppendInt(append(b, `,"pid":`...), int64(r.PID), 10)
	}
	b = appendUintField(b, `,"pidStart":`, r.PIDStart)
	b = appendUintField(b, `,"deadline":`, r.Deadline)
	if b, ok = appendStrings(b, `,"ips":`, r.IPs); !ok {
		return nil, false
	}
	if b, ok = appendStrings(b, `,"legacyLeases":`, r.LegacyLeases); !ok {
		return nil, false
	}
	return append(b, '}'), true
}

// appendUintField appends an omitempty unsigned field.
func appendUintField(b []byte, key string, v uint64) []byte {
	if v == 0 {
		return b
	}
	return strconv.AppendUint(append(b, key...), v, 10)
}

// appendStrings appends an omitempty list of strings.
func appendStrings(b []byte, key string, list []string) (_ []byte, ok bool) {
	if len(list) == 0 {
		return b, true
	}
	b = append(b, key...)
	for i, s := range list {
		if i == 0 {
			b = append(b, '[')
		} else {
			b = append(b, ',')
		}
		if b, ok = appendPlainString(b, s); !ok {
			return nil, false
		}
	}
	return append(b, ']'), true
}

// appendPlainString quotes s when encoding/json writes it unescaped:
// printable ASCII other than the quote, the backslash and the three
// characters it escapes for HTML (<, >, &).
func appendPlainString(b []byte, s string) (_ []byte, ok bool) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return nil, false
		}
	}
	return append(append(append(b, '"'), s...), '"'), true
}
