package plugin

import (
	"fmt"
	"testing"
)

// BenchmarkVerbs is the plugin's own work per verb, in-process: every
// delegate is a fake that answers at once, the host is faked, the data dir
// is real. What a verb costs on a host is this plus its process start and
// its delegates' (test/bench measures those against a do-nothing plugin);
// profile it with -cpuprofile to see where the plugin's own time goes.
func BenchmarkVerbs(b *testing.B) {
	for _, interval := range []string{"10s", "0s"} {
		b.Run("checkSweepInterval="+interval, func(b *testing.B) {
			h := newHarness(b, "bridge", "host-local")
			h.exec.reply["bridge ADD"] = bridgeResult100
			stdin := h.conf("1.0.0", fmt.Sprintf(`,"checkSweepInterval":%q`, interval))
			i := 0
			for b.Loop() {
				i++
				args := h.args(stdin)
				args.ContainerID = fmt.Sprintf("c%d", i)
				for _, verb := range []func() error{
					func() error { return h.plugin.Funcs().Add(args) },
					func() error { return h.plugin.Funcs().Check(args) },
					func() error { return h.plugin.Funcs().Del(args) },
				} {
					if err := verb(); err != nil {
						b.Fatal(err)
					}
				}
				h.stdout.Reset()
				h.stderr.Reset()
				h.exec.calls = h.exec.calls[:0]
			}
		})
	}
}
