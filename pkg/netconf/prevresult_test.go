package netconf

import (
	"testing"
)

// Results as bridge writes them (through libcni's cache, converted to the
// entry's version), the prevResult of every CHECK and DEL.
const (
	bridgeResult040 = `{"cniVersion":"0.4.0","interfaces":[{"name":"nomad","mac":"0a:58:ac:1a:40:01"},{"name":"veth3f2a9c1e","mac":"6e:1f:2b:9a:10:44"},{"name":"eth0","mac":"0a:58:ac:1a:40:0c","sandbox":"/var/run/netns/7c1e"}],"ips":[{"version":"4","interface":2,"address":"172.26.64.12/20","gateway":"172.26.64.1"}],"routes":[{"dst":"0.0.0.0/0"}],"dns":{}}`
	bridgeResult100 = `{"cniVersion":"1.0.0","interfaces":[{"name":"cni0","mac":"0a:58:0a:58:00:01"},{"name":"veth1","mac":"6e:1f:2b:9a:10:44"},{"name":"eth0","mac":"0a:58:0a:58:00:0c","sandbox":"/var/run/netns/x"}],"ips":[{"interface":2,"address":"10.88.0.12/16","gateway":"10.88.0.1"},{"interface":2,"address":"2001:4860:4860::c/64","gateway":"2001:4860:4860::1"}],"routes":[{"dst":"0.0.0.0/0","gw":"10.88.0.1"},{"dst":"::/0"}],"dns":{"nameservers":["10.88.0.1"],"domain":"local","search":["svc"],"options":["ndots:5"]}}`
	bridgeResult110 = `{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","mac":"0a:58:0a:58:00:0c","mtu":1500,"sandbox":"/var/run/netns/x"}],"ips":[{"interface":0,"address":"10.88.0.12/16"}],"routes":[{"dst":"0.0.0.0/0","gw":"10.88.0.1","mtu":1400,"priority":10,"table":100,"scope":0}]}`
)

func TestPrevResultSurelyValid(t *testing.T) {
	cases := []struct {
		name, version, prev string
		sure                bool
	}{
		{"bridge 0.4.0", "0.4.0", bridgeResult040, true},
		{"bridge 0.4.0 in a 0.3.1 entry", "0.3.1", `{"cniVersion":"0.3.1","ips":[{"version":"4","address":"10.0.0.2/24"}]}`, true},
		{"bridge 1.0.0, dual stack, dns", "1.0.0", bridgeResult100, true},
		{"1.1.0 with mtu and route attributes", "1.1.0", bridgeResult110, true},
		{"no cniVersion: the entry's", "1.0.0", `{"ips":[{"address":"10.0.0.2/24"}]}`, true},
		{"empty", "1.0.0", `{}`, true},
		{"space around", "1.0.0", " \n{ \"ips\" : [ { \"address\" : \"10.0.0.2/24\" , \"interface\" : -0 } ] }\n", true},

		// Valid or not, these go to the CNI library.
		{"a key it does not know", "1.0.0", `{"ips":[],"x":1}`, false},
		{"a key in another case", "1.0.0", `{"IPs":[]}`, false},
		{"version in a 1.0.0 IP config", "1.0.0", `{"ips":[{"version":"4","address":"10.0.0.2/24"}]}`, false},
		{"mtu in a 0.4.0 interface", "0.4.0", `{"interfaces":[{"name":"eth0","mtu":1500}]}`, false},
		{"null gateway", "1.0.0", `{"ips":[{"address":"10.0.0.2/24","gateway":null}]}`, false},
		{"null list", "1.0.0", `{"ips":null}`, false},
		{"interface as 2.0", "1.0.0", `{"ips":[{"interface":2.0,"address":"10.0.0.2/24"}]}`, false},
		{"interface as 1e2", "1.0.0", `{"ips":[{"interface":1e2,"address":"10.0.0.2/24"}]}`, false},
		{"interface of ten digits", "1.0.0", `{"ips":[{"interface":1234567890}]}`, false},
		{"interface as a string", "1.0.0", `{"ips":[{"interface":"2"}]}`, false},
		{"repeated key hiding a huge number", "1.0.0", `{"ips":1e400,"ips":[]}`, false},
		{"address not a CIDR", "1.0.0", `{"ips":[{"address":"10.0.0.2"}]}`, false},
		{"gateway not an IP", "1.0.0", `{"ips":[{"address":"10.0.0.2/24","gateway":"x"}]}`, false},
		{"empty gateway", "1.0.0", `{"ips":[{"address":"10.0.0.2/24","gateway":""}]}`, false},
		{"route without a CIDR", "1.0.0", `{"routes":[{"dst":"default"}]}`, false},
		{"dns a list", "1.0.0", `{"dns":[]}`, false},
		{"nameservers not strings", "1.0.0", `{"dns":{"nameservers":[1]}}`, false},
		{"result of another version", "0.4.0", `{"cniVersion":"1.0.0"}`, false},
		{"result version not a string", "1.0.0", `{"cniVersion":1}`, false},
		{"0.2.0 entry", "0.2.0", `{"ip4":{"ip":"10.0.0.2/24"}}`, false},
		{"unknown entry version", "9.9.9", `{}`, false},
		{"not an object", "1.0.0", `[]`, false},
		{"null", "1.0.0", `null`, false},
		{"not JSON", "1.0.0", `{"ips":[}`, false},
		{"a string with an escaped quote and digits", "1.0.0", `{"interfaces":[{"name":"a\"1e400\\"}]}`, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sure := prevResultSurelyValid([]byte(c.prev), c.version)
			if sure != c.sure {
				t.Fatalf("prevResultSurelyValid = %v, want %v", sure, c.sure)
			}
			if sure {
				if err := parsePrevResult([]byte(c.prev), c.version); err != nil {
					t.Fatalf("the CNI library refuses what the fast path took: %v", err)
				}
			}
		})
	}
}

// FuzzPrevResultSurelyValid: whatever the input and version, the fast path
// never takes a prevResult the CNI library refuses.
func FuzzPrevResultSurelyValid(f *testing.F) {
	for _, seed := range []string{bridgeResult040, bridgeResult100, bridgeResult110, `{"ips":1e400,"ips":[]}`, `{"ips":[{"interface":-0}]}`, `{}`} {
		for v := range prevResultVersions {
			f.Add([]byte(seed), uint8(v))
		}
	}
	f.Fuzz(func(t *testing.T, prev []byte, v uint8) {
		version := prevResultVersions[int(v)%len(prevResultVersions)]
		if !prevResultSurelyValid(prev, version) {
			return
		}
		if err := parsePrevResult(prev, version); err != nil {
			t.Fatalf("fast path took %q for %s; the CNI library says: %v", prev, version, err)
		}
	})
}

var prevResultVersions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", "0.2.0", ""}
