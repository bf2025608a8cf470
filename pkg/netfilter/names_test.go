package netfilter

import (
	"testing"

	"github.com/containernetworking/plugins/pkg/utils"
)

// FuzzNamesMatchUpstream: the chain names and comments built here are
// byte for byte those of plugins/pkg/utils, which bridge and portmap use.
func FuzzNamesMatchUpstream(f *testing.F) {
	f.Add("nomad", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
	f.Add("", "")
	f.Add(`a"b\c`, "id\x00\n\u00e9")
	f.Fuzz(func(t *testing.T, network, containerID string) {
		if got, want := chainName(network, containerID), utils.FormatChainName(network, containerID); got != want {
			t.Errorf("chainName(%q, %q) = %q, want %q", network, containerID, got, want)
		}
		for _, prefix := range []string{"DN-", "SN-"} {
			if got, want := chainNameWithPrefix(network, containerID, prefix), utils.MustFormatChainNameWithPrefix(network, containerID, prefix); got != want {
				t.Errorf("chainNameWithPrefix(%q, %q, %q) = %q, want %q", network, containerID, prefix, got, want)
			}
		}
		if got, want := formatComment(network, containerID), utils.FormatComment(network, containerID); got != want {
			t.Errorf("formatComment(%q, %q) = %q, want %q", network, containerID, got, want)
		}
		if got, want := formatHashWithPrefix(16, "", network), utils.MustFormatHashWithPrefix(16, "", network); got != want {
			t.Errorf("formatHashWithPrefix(16, \"\", %q) = %q, want %q", network, got, want)
		}
	})
}
