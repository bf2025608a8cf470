package e2e

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// flannelSubnetEnv is /run/flannel/subnet.env as flannel's CNI plugin reads
// it (flannel-io/cni-plugin flannel.go loadFlannelSubnetEnv).
type flannelSubnetEnv struct {
	nws, ip6Nws []*net.IPNet
	sn, ip6Sn   *net.IPNet
	mtu         *uint
	ipmasq      *bool
}

func parseFlannelSubnetEnv(text string) (*flannelSubnetEnv, error) {
	se := &flannelSubnetEnv{}
	s := bufio.NewScanner(strings.NewReader(text))
	for s.Scan() {
		parts := strings.SplitN(s.Text(), "=", 2)
		if len(parts) != 2 {
			continue
		}
		switch parts[0] {
		case "FLANNEL_NETWORK", "FLANNEL_IPV6_NETWORK":
			for _, cidr := range strings.Split(parts[1], ",") {
				_, nw, err := net.ParseCIDR(cidr)
				if err != nil {
					return nil, err
				}
				if parts[0] == "FLANNEL_NETWORK" {
					se.nws = append(se.nws, nw)
				} else {
					se.ip6Nws = append(se.ip6Nws, nw)
				}
			}
		case "FLANNEL_SUBNET":
			// "10.42.0.1/24" (the first address): ParseCIDR masks it.
			_, sn, err := net.ParseCIDR(parts[1])
			if err != nil {
				return nil, err
			}
			se.sn = sn
		case "FLANNEL_IPV6_SUBNET":
			_, sn, err := net.ParseCIDR(parts[1])
			if err != nil {
				return nil, err
			}
			se.ip6Sn = sn
		case "FLANNEL_MTU":
			mtu, err := strconv.ParseUint(parts[1], 10, 32)
			if err != nil {
				return nil, err
			}
			m := uint(mtu)
			se.mtu = &m
		case "FLANNEL_IPMASQ":
			b := parts[1] == "true"
			se.ipmasq = &b
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	if (se.nws == nil && se.ip6Nws == nil) || (se.sn == nil && se.ip6Sn == nil) || se.mtu == nil || se.ipmasq == nil {
		return nil, fmt.Errorf("subnet.env is missing a variable: %q", text)
	}
	return se, nil
}

// flannelDelegate reproduces what flannel's CNI plugin (flannel-io/cni-plugin
// v1.x, flannel.go cmdAdd and flannel_linux.go doCmdAdd/getDelegateIPAM)
// hands its delegate, given its own stdin (the flannel entry of the
// conflist, as libcni passes it) and subnet.env:
//
//   - the delegate map of the entry, which may not hold "name" or "ipam";
//   - "runtimeConfig" copied from the entry when present;
//   - "name" = the network name, "type" defaulted to "bridge";
//   - "ipMasq" defaulted to !FLANNEL_IPMASQ, "mtu" to FLANNEL_MTU;
//   - "isGateway": true added only when the type is "bridge";
//   - "cniVersion" copied from the entry;
//   - "ipam": the entry's own ipam map (every key kept, "type" defaulted to
//     host-local) with "ranges" replaced by the subnet(s) of subnet.env and
//     "routes" = the map's routes plus one per FLANNEL_(IPV6_)NETWORK.
//
// On DEL flannel replays exactly these bytes (saved in its dataDir).
func flannelDelegate(stdin []byte, fenv *flannelSubnetEnv) (map[string]any, error) {
	var n struct {
		types.NetConf
		IPAM          map[string]any `json:"ipam,omitempty"`
		Delegate      map[string]any `json:"delegate"`
		RuntimeConfig map[string]any `json:"runtimeConfig,omitempty"`
	}
	if err := json.Unmarshal(stdin, &n); err != nil {
		return nil, fmt.Errorf("failed to load netconf: %w", err)
	}
	if n.Delegate == nil {
		n.Delegate = map[string]any{}
	} else {
		if typ, ok := n.Delegate["type"]; ok {
			if _, isString := typ.(string); !isString {
				return nil, errors.New("'delegate' dictionary, if present, must have (string) 'type' field")
			}
		}
		if _, ok := n.Delegate["name"]; ok {
			return nil, errors.New("'delegate' dictionary must not have 'name' field, it'll be set by flannel")
		}
		if _, ok := n.Delegate["ipam"]; ok {
			return nil, errors.New("'delegate' dictionary must not have 'ipam' field, it'll be set by flannel")
		}
	}
	if n.RuntimeConfig != nil {
		n.Delegate["runtimeConfig"] = n.RuntimeConfig
	}

	d := n.Delegate
	d["name"] = n.Name
	if _, ok := d["type"]; !ok {
		d["type"] = "bridge"
	}
	if _, ok := d["ipMasq"]; !ok {
		d["ipMasq"] = !*fenv.ipmasq
	}
	if _, ok := d["mtu"]; !ok {
		d["mtu"] = *fenv.mtu
	}
	if d["type"].(string) == "bridge" {
		if _, ok := d["isGateway"]; !ok {
			d["isGateway"] = true
		}
	}
	if n.CNIVersion != "" {
		d["cniVersion"] = n.CNIVersion
	}

	ipam := n.IPAM
	if ipam == nil {
		ipam = map[string]any{}
	}
	if _, ok := ipam["type"]; !ok {
		ipam["type"] = "host-local"
	}
	var ranges [][]map[string]any
	if fenv.sn != nil && fenv.sn.String() != "" {
		ranges = append(ranges, []map[string]any{{"subnet": fenv.sn.String()}})
	}
	if fenv.ip6Sn != nil && fenv.ip6Sn.String() != "" {
		ranges = append(ranges, []map[string]any{{"subnet": fenv.ip6Sn.String()}})
	}
	ipam["ranges"] = ranges
	routes := []types.Route{}
	if r, ok := ipam["routes"]; ok {
		buf, _ := json.Marshal(r)
		if err := json.Unmarshal(buf, &routes); err != nil {
			return nil, fmt.Errorf("failed to read IPAM routes: failed to parse ipam.routes: %w", err)
		}
	}
	for _, nw := range append(slices.Clone(fenv.nws), fenv.ip6Nws...) {
		if nw != nil {
			routes = append(routes, types.Route{Dst: *nw})
		}
	}
	ipam["routes"] = routes
	d["ipam"] = ipam
	return d, nil
}

// flannelStdin is what libcni hands the first plugin of a conflist: the
// entry with the list's name and cniVersion injected.
func flannelStdin(t *testing.T, conf map[string]any) []byte {
	t.Helper()
	return entryConfig(t, conf, "flannel")
}

// canonicalJSON decodes any JSON-marshallable value back into plain maps,
// slices, strings, float64s and bools, so that two documents compare with
// reflect.DeepEqual whatever their key order or Go types were.
func canonicalJSON(t *testing.T, v any) any {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	var out any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	return out
}

func jsonEqual(t *testing.T, a, b any) bool {
	t.Helper()
	return reflect.DeepEqual(canonicalJSON(t, a), canonicalJSON(t, b))
}
