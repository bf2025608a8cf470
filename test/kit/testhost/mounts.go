package testhost

import (
	"os"
	"slices"
	"strings"
)

// MountsUnder lists the mount points below dir, deepest first: the order
// to unmount them in.
func MountsUnder(dir string) ([]string, error) {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	unescape := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	var out []string
	for line := range strings.SplitSeq(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 {
			if p := unescape.Replace(f[4]); strings.HasPrefix(p, dir+"/") {
				out = append(out, p)
			}
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out, nil
}
