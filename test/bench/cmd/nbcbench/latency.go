package main

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
)

// The CNI verbs are driven in-process through libcni, the library cnitool,
// Nomad (through go-cni), containerd and CRI-O all use: the same plugin
// execs as `cnitool add|check|del`, without timing cnitool's own start-up
// (which would be the same for A and B and only dilute the ratio).
func (e *Env) cni() *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir([]string{e.o.bin}, filepath.Join(e.o.work, "libcni-cache"), nil)
}

func (v *variant) list() (*libcni.NetworkConfigList, error) {
	return libcni.NetworkConfFromBytes(v.confList)
}

func cniContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), cmdTimeout)
}

// attachment is one container of a benchmark: namespace + runtime conf.
type attachment struct {
	nsName string
	rt     *libcni.RuntimeConf
}

func (e *Env) newAttachment(v *variant, tag string) (*attachment, error) {
	name, path, err := e.addNetns(v.label)
	if err != nil {
		return nil, err
	}
	return &attachment{nsName: name, rt: &libcni.RuntimeConf{
		ContainerID: e.containerID(v, tag),
		NetNS:       path,
		IfName:      ifName,
	}}, nil
}

// verbTimes is one container's ADD, CHECK and DEL, wall and CPU, in ms.
type verbTimes struct {
	add, check, del          float64
	addCPU, checkCPU, delCPU float64
}

func (e *Env) addCheckDel(cfg *libcni.CNIConfig, v *variant, tag string) (verbTimes, error) {
	var t verbTimes
	list, err := v.list()
	if err != nil {
		return t, err
	}
	a, err := e.newAttachment(v, tag)
	if err != nil {
		return t, err
	}
	defer delNetns(a.nsName)
	ctx, cancel := cniContext()
	defer cancel()

	// CPU: the plugins' (and their iptables') user + system time, from
	// RUSAGE_CHILDREN: libcni waits for every plugin it runs.
	c0, t0 := childrenCPU(), time.Now()
	if _, err := cfg.AddNetworkList(ctx, list, a.rt); err != nil {
		return t, fmt.Errorf("%s ADD: %w", v.label, err)
	}
	c1, t1 := childrenCPU(), time.Now()
	if err := cfg.CheckNetworkList(ctx, list, a.rt); err != nil {
		cfg.DelNetworkList(ctx, list, a.rt)
		return t, fmt.Errorf("%s CHECK: %w", v.label, err)
	}
	c2, t2 := childrenCPU(), time.Now()
	if err := cfg.DelNetworkList(ctx, list, a.rt); err != nil {
		return t, fmt.Errorf("%s DEL: %w", v.label, err)
	}
	c3, t3 := childrenCPU(), time.Now()
	t.add, t.check, t.del = ms(t1.Sub(t0)), ms(t2.Sub(t1)), ms(t3.Sub(t2))
	t.addCPU, t.checkCPU, t.delCPU = ms(c1-c0), ms(c2-c1), ms(c3-c2)
	return t, nil
}

// benchLatency runs warm-up pairs, then `pairs` pairs A B A B ..., each
// container in a fresh namespace.
func (e *Env) benchLatency(res *Results) error {
	cfg := e.cni()
	// Warm-up: the first ADD of a network creates its bridge, the first
	// plugin ADD writes the migration marker, the page cache fills.
	for i := range 2 {
		for _, v := range []*variant{e.a, e.b} {
			if _, err := e.addCheckDel(cfg, v, fmt.Sprintf("warm%d", i)); err != nil {
				return err
			}
		}
	}
	var a, b [6][]float64
	for i := range e.o.pairs {
		if err := e.canceled(); err != nil {
			return err
		}
		for _, v := range []*variant{e.a, e.b} {
			t, err := e.addCheckDel(cfg, v, fmt.Sprintf("lat%03d", i))
			if err != nil {
				return err
			}
			dst := &a
			if v == e.b {
				dst = &b
			}
			dst[0] = append(dst[0], t.add)
			dst[1] = append(dst[1], t.check)
			dst[2] = append(dst[2], t.del)
			dst[3] = append(dst[3], t.addCPU)
			dst[4] = append(dst[4], t.checkCPU)
			dst[5] = append(dst[5], t.delCPU)
		}
	}
	res.Pairs = e.o.pairs
	for i, verb := range []string{"ADD", "CHECK", "DEL"} {
		res.Latency = append(res.Latency, makePair(verb, a[i], b[i]).withCPU(a[i+3], b[i+3]))
	}
	var ta, tb, ca, cb []float64
	for i := range a[0] {
		ta = append(ta, a[0][i]+a[1][i]+a[2][i])
		tb = append(tb, b[0][i]+b[1][i]+b[2][i])
		ca = append(ca, a[3][i]+a[4][i]+a[5][i])
		cb = append(cb, b[3][i]+b[4][i]+b[5][i])
	}
	res.Latency = append(res.Latency, makePair("ADD+CHECK+DEL", ta, tb).withCPU(ca, cb))
	return nil
}

// benchConcurrent starts `parallel` containers at once through each chain,
// rounds A B A B ..., and reports containers per second.
func (e *Env) benchConcurrent(res *Results) error {
	cfg := e.cni()
	n := e.o.parallel
	var a, b, ca, cb []float64
	for r := range e.o.rounds {
		for _, v := range []*variant{e.a, e.b} {
			if err := e.canceled(); err != nil {
				return err
			}
			list, err := v.list()
			if err != nil {
				return err
			}
			atts := make([]*attachment, n)
			for i := range atts {
				if atts[i], err = e.newAttachment(v, fmt.Sprintf("par%d-%02d", r, i)); err != nil {
					return err
				}
			}
			ctx, cancel := cniContext()
			errs := make([]error, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i, at := range atts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					_, errs[i] = cfg.AddNetworkList(ctx, list, at.rt)
				}()
			}
			c0, t0 := childrenCPU(), time.Now()
			close(start)
			wg.Wait()
			elapsed := time.Since(t0)
			cpu := ms(childrenCPU()-c0) / float64(n)
			// Tear down (untimed), in parallel too.
			for _, at := range atts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cfg.DelNetworkList(ctx, list, at.rt)
				}()
			}
			wg.Wait()
			cancel()
			for _, at := range atts {
				delNetns(at.nsName)
			}
			for i, err := range errs {
				if err != nil {
					return fmt.Errorf("%s parallel ADD %d: %w", v.label, i, err)
				}
			}
			rate := float64(n) / elapsed.Seconds()
			if v == e.a {
				a, ca = append(a, rate), append(ca, cpu)
			} else {
				b, cb = append(b, rate), append(cb, cpu)
			}
		}
	}
	p := makePair("containers/s", a, b).withCPU(ca, cb)
	res.Parallel = n
	res.Throughput = &p
	return nil
}
