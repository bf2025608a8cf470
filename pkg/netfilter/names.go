package netfilter

import (
	"crypto/sha512"
	"encoding/hex"
	"strconv"
)

// The names and comments bridge and portmap give a container's NAT state,
// as plugins/pkg/utils builds them. Written out here: linking that package
// (and with it its iptables and knftables dependencies) was measured to
// raise the plugin's cold start to 1.12× the do-nothing plugin's, over
// the 1.10× bound make bench judges.

// chainNameLength is utils.maxChainLength: every per-container chain name
// is exactly this long.
const chainNameLength = 28

// chainName is utils.FormatChainName: bridge's per-container ipMasq chain.
func chainName(network, containerID string) string {
	return chainNameWithPrefix(network, containerID, "")
}

// chainNameWithPrefix is utils.MustFormatChainNameWithPrefix, e.g.
// portmap's "CNI-DN-…" chains.
func chainNameWithPrefix(network, containerID, prefix string) string {
	return formatHashWithPrefix(chainNameLength, "CNI-"+prefix, network+containerID)
}

// formatComment is utils.FormatComment: the comment on bridge's
// POSTROUTING jump (portmap's DNAT jump adds "dnat " in front).
func formatComment(network, containerID string) string {
	return "name: " + strconv.Quote(network) + " id: " + strconv.Quote(containerID)
}

// formatHashWithPrefix is utils.MustFormatHashWithPrefix: prefix, then the
// hex SHA-512 of toHash, cut to length.
func formatHashWithPrefix(length int, prefix, toHash string) string {
	if len(prefix) >= length || length > 2*sha512.Size {
		panic("invalid length")
	}
	sum := sha512.Sum512([]byte(toHash))
	return (prefix + hex.EncodeToString(sum[:]))[:length]
}
