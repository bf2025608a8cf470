#!/usr/bin/env bash
# test/demo/demo.sh: what `make demo` runs.
#
# Reproduces the bug nomad-bridge-cni fixes, then shows the fix, with the real
# reference plugins, cnitool and real network namespaces:
#
#   part 1  the bare `bridge` chain keeps host-local's leases on disk; after a
#           "reboot" the same container cannot get its network back:
#           "... has been allocated to <id>, duplicate allocation is not allowed"
#   part 2  the same chain with "type": "nomad-bridge-cni" keeps the leases on a
#           tmpfs; after the same "reboot" the container gets its network back,
#           pings its gateway and CHECK passes; a second container that dies
#           without a DEL is released by what the packages' gc timer runs
#           (`gc --all-data-dirs`: lease, masquerade rule, record); DEL releases
#           the first one's lease.
#
# Exits 0 only if part 1 failed the upstream way AND part 2 succeeded.
# Everything it creates (namespaces, links, iptables rules and chains, cnitool
# cache files, the tmpfs, temp files) is removed on exit, also on failure or ^C.
# Needs root, iproute2, iptables and ping. Network traffic goes only to
# addresses inside the namespaces it creates.
#
# Environment: BIN  directory holding nomad-bridge-cni, bridge, host-local,
#                   loopback, firewall, portmap and cnitool (default: <repo>/bin)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${BIN:-$REPO/bin}
TEMPLATE=$REPO/conflist/nomad.conflist
NETNS_DIR=/var/run/netns          # where `ip netns` keeps namespaces (cnitool hashes this path)
CNI_CACHE=/var/lib/cni            # libcni's cache dir (cnitool keeps ADD results there)

# ---------------------------------------------------------------- output ---
if [[ -t 1 ]]; then
	BOLD=$'\e[1m' RED=$'\e[31m' GREEN=$'\e[32m' YELLOW=$'\e[33m' DIM=$'\e[2m' RESET=$'\e[0m'
else
	BOLD='' RED='' GREEN='' YELLOW='' DIM='' RESET=''
fi
STEP=0
part() { printf '\n%s=== %s ===%s\n' "$BOLD" "$*" "$RESET"; }
step() { STEP=$((STEP + 1)); printf '\n%s[%d] %s%s\n' "$BOLD" "$STEP" "$*" "$RESET"; }
say() { printf '    %s\n' "$@"; }
# fd 3/4: the script's own stdout/stderr. Commands are echoed to fd 3 so that
# capturing a command's output never captures the echo, and the clean-up
# writes there even if a signal arrives while a redirected command runs.
exec 3>&1 4>&2
cmdline() { printf '    %s$ %s%s\n' "$DIM" "$*" "$RESET" >&3; }
evidence() { sed -e 's/\r$//' -e 's/^/      | /'; }
# On failure cnitool prints "Error: <message>", its usage text, then the message
# again: keep what comes before the usage text (plugin stderr and the error).
errtext() { awk '/^Usage:/ { exit } { print }' <<<"$1"; }
ok() { printf '    %sOK%s %s\n' "$GREEN" "$RESET" "$*"; }
warn() { printf '    %sWARNING%s %s\n' "$YELLOW" "$RESET" "$*" >&2; }
die() {
	printf '\n%sDEMO FAILED:%s %s\n' "$RED" "$RESET" "$*" >&2
	exit 1
}

# ------------------------------------------------------------- preflight ---
[[ $(id -u) -eq 0 ]] || die "must run as root (it creates network namespaces, a bridge, iptables rules and a tmpfs mount); try: sudo make demo"

need_cmd() { # command, package that provides it
	command -v "$1" >/dev/null 2>&1 || die "'$1' not found in PATH; install it first (Debian/Ubuntu: apt-get install $2)"
}
need_cmd ip iproute2
need_cmd iptables iptables
need_cmd ip6tables iptables # the firewall plugin opens both
need_cmd ping iputils-ping
for c in mount umount mountpoint findmnt mktemp sha512sum sed awk find; do need_cmd "$c" "coreutils util-linux mawk sed findutils"; done

[[ -d $BIN ]] || die "plugin directory BIN=$BIN does not exist; build with: make build plugins (or run: make demo)"
BIN=$(cd "$BIN" && pwd)
for p in nomad-bridge-cni bridge host-local loopback firewall portmap cnitool; do
	[[ -x $BIN/$p ]] || die "$BIN/$p is missing; build with: make build plugins (or run: make demo)"
done
[[ -r $TEMPLATE ]] || die "$TEMPLATE not found"
ip netns list >/dev/null 2>&1 || die "'ip netns' does not work here (network namespaces unavailable?)"

# ----------------------------------------------------------------- names ---
SUFFIX=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
NET_BARE=nbc-demo-$SUFFIX-bare       # network names (conflist "name")
NET_PLUGIN=nbc-demo-$SUFFIX-plugin
BR_BARE=nbcd${SUFFIX}b               # bridge names (<= 15 chars)
BR_PLUGIN=nbcd${SUFFIX}p
NS_BARE=nbc-demo-$SUFFIX-ctr1        # the "containers"
NS_PLUGIN=nbc-demo-$SUFFIX-ctr2
NS_DEAD=nbc-demo-$SUFFIX-ctr3        # dies without a DEL; the timer's gc releases it

# Two adjacent /24s in 10/8 that nothing on this host uses yet.
pick_subnets() {
	local a b used
	used=$({ ip -4 -o addr show; ip -4 route show table all; } 2>/dev/null || true)
	for _ in {1..50}; do
		a=$((RANDOM % 150 + 100)) b=$((RANDOM % 127 * 2))
		if ! grep -Eq "(^|[^0-9.])10\.$a\.($b|$((b + 1)))\." <<<"$used"; then
			echo "$a $b"
			return 0
		fi
	done
	return 1
}
read -r OCT_A OCT_B < <(pick_subnets) || die "could not find a free 10.x.y.0/24 on this host"
SUBNET_BARE=10.$OCT_A.$OCT_B.0/24
SUBNET_PLUGIN=10.$OCT_A.$((OCT_B + 1)).0/24

# cnitool's container ID: "cnitool-" + the first 10 bytes of sha512(netns path).
container_id() { printf 'cnitool-%s' "$(printf '%s' "$NETNS_DIR/$1" | sha512sum | cut -c1-20)"; }
# bridge's ipMasq chain: utils.FormatChainName(network, containerID).
masq_chain() { printf 'CNI-%s' "$(printf '%s%s' "$1" "$2" | sha512sum | cut -c1-24)"; }
CID_BARE=$(container_id "$NS_BARE")
CID_PLUGIN=$(container_id "$NS_PLUGIN")
CID_DEAD=$(container_id "$NS_DEAD")

# ------------------------------------------- state recorded for clean-up ---
WORK=''
RUN_MNT=''                      # our tmpfs (the plugin's dataDir)
CREATED_NS=()
CREATED_BR=()
CLEAN_NETS=()                   # "name subnet cid" of every network we used
had_dir() { [[ -d $1 ]] && echo 1 || echo 0; }
HAD_CACHE=$(had_dir $CNI_CACHE)
HAD_RESULTS=$(had_dir $CNI_CACHE/results)
HAD_NETWORKS=$(had_dir $CNI_CACHE/networks)
HAD_NETNS_DIR=$(had_dir /run/netns)
NETNS_DIR_WAS_MOUNT=0
mountpoint -q /run/netns 2>/dev/null && NETNS_DIR_WAS_MOUNT=1
chain_exists() { iptables -w -t "$1" -n -L "$2" >/dev/null 2>&1; }
HAD_CNI_FORWARD=0 HAD_ADMIN=0
chain_exists filter CNI-FORWARD && HAD_CNI_FORWARD=1
chain_exists filter NOMAD-ADMIN && HAD_ADMIN=1
IP_FORWARD_BEFORE=$(cat /proc/sys/net/ipv4/ip_forward)

# Remove every iptables rule/chain the chain's plugins made for network $1
# (subnet $2, container $3): bridge's masquerade jump (comment names the
# network) and its CNI-<hash> chain, portmap's jumps (comment names the
# network) and CNI-DN-<hash> chains, firewall's per-IP rules in CNI-FORWARD.
purge_iptables() {
	local net=$1 subnet=$2 cid=$3 prefix tbl line target rules=0 nchains=0
	local -a chains=()
	prefix=${subnet%.0/24}.
	for tbl in nat filter mangle; do
		while IFS= read -r line; do
			case $line in
			"-A "*"$net"*) ;;
			"-A CNI-FORWARD -s $prefix"* | "-A CNI-FORWARD -d $prefix"*) ;;
			*) continue ;;
			esac
			target=$(sed -n 's/.* -j \([^ ]*\).*/\1/p' <<<"$line")
			# the line comes from iptables -S for a network name we generated
			if eval "iptables -w -t $tbl -D ${line#-A }" 2>/dev/null; then rules=$((rules + 1)); fi
			if [[ $target =~ ^CNI-(DN-)?[0-9a-f]+$ ]]; then chains+=("$tbl $target"); fi
		done < <(iptables -w -t "$tbl" -S 2>/dev/null)
	done
	chains+=("nat $(masq_chain "$net" "$cid")")
	for line in "${chains[@]}"; do
		read -r tbl target <<<"$line"
		if chain_exists "$tbl" "$target"; then
			iptables -w -t "$tbl" -F "$target" 2>/dev/null || true
			if iptables -w -t "$tbl" -X "$target" 2>/dev/null; then nchains=$((nchains + 1)); fi
		fi
	done
	echo "$rules iptables rule(s) and $nchains chain(s)"
}

netns_exists() { [[ -e $NETNS_DIR/$1 ]]; }
delete_netns() { if netns_exists "$1"; then ip netns delete "$1"; fi; }
delete_bridge() {
	local br=$1 l
	ip link show "$br" >/dev/null 2>&1 || return 0
	for l in $(ip -o link show master "$br" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
		ip link delete "$l" 2>/dev/null || true
	done
	ip link delete "$br"
}

cleanup() {
	local rc=$? entry net subnet cid n leftovers=0
	set +e
	trap - EXIT TERM
	trap '' INT HUP # a second ^C must not cut the clean-up short
	exec >&3 2>&4
	if [[ $rc -ne 0 ]]; then
		printf '\n%sCleaning up after failure (exit status %d)...%s\n' "$BOLD" "$rc" "$RESET"
	else
		printf '\n%sCleaning up...%s\n' "$BOLD" "$RESET"
	fi
	for n in "${CREATED_NS[@]}"; do delete_netns "$n"; done
	for n in "${CREATED_BR[@]}"; do delete_bridge "$n"; done
	for entry in "${CLEAN_NETS[@]}"; do
		read -r net subnet cid <<<"$entry"
		n=$(purge_iptables "$net" "$subnet" "$cid")
		rm -f "$CNI_CACHE/results/$net"-*
		if [[ -e $CNI_CACHE/networks/$net ]]; then
			warn "$CNI_CACHE/networks/$net exists (something wrote host-local state to the default dir); removing it"
			rm -rf "${CNI_CACHE:?}/networks/$net"
		fi
		say "network $net: removed $n, and cnitool's cache"
	done
	# The firewall plugin's shared chains: remove them only if this run created
	# them and they hold nothing but the plugin's own admin-chain jump.
	if [[ $HAD_CNI_FORWARD -eq 0 ]] && chain_exists filter CNI-FORWARD &&
		[[ $(iptables -w -S CNI-FORWARD | grep -cv -e '^-N ' -e 'CNI firewall plugin admin overrides') -eq 0 ]]; then
		iptables -w -D FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD 2>/dev/null
		iptables -w -F CNI-FORWARD && iptables -w -X CNI-FORWARD
	fi
	if [[ $HAD_ADMIN -eq 0 ]] && chain_exists filter NOMAD-ADMIN &&
		[[ $(iptables -w -S NOMAD-ADMIN | grep -cv '^-N ') -eq 0 ]]; then
		iptables -w -X NOMAD-ADMIN 2>/dev/null
	fi
	if [[ $(cat /proc/sys/net/ipv4/ip_forward) != "$IP_FORWARD_BEFORE" ]]; then
		echo "$IP_FORWARD_BEFORE" >/proc/sys/net/ipv4/ip_forward # bridge (isGateway) turned it on
	fi
	[[ $HAD_RESULTS -eq 1 ]] || rmdir "$CNI_CACHE/results" 2>/dev/null
	[[ $HAD_NETWORKS -eq 1 ]] || rmdir "$CNI_CACHE/networks" 2>/dev/null
	[[ $HAD_CACHE -eq 1 ]] || rmdir "$CNI_CACHE" 2>/dev/null
	# `ip netns add` made /run/netns a mount point; undo that if it was us and it is empty.
	if [[ $HAD_NETNS_DIR -eq 0 && $NETNS_DIR_WAS_MOUNT -eq 0 ]] && [[ -d /run/netns ]] &&
		[[ -z $(ls -A /run/netns) ]]; then
		if mountpoint -q /run/netns; then umount /run/netns 2>/dev/null; fi
		rmdir /run/netns 2>/dev/null
	fi
	if [[ -n $RUN_MNT ]] && mountpoint -q "$RUN_MNT"; then
		umount "$RUN_MNT" 2>/dev/null || umount -l "$RUN_MNT"
	fi
	if [[ -n $WORK && -d $WORK ]]; then
		if findmnt -rn -o TARGET | grep -q "^$WORK"; then
			warn "something is still mounted under $WORK; leaving it"
			leftovers=1
		else
			rm -rf --one-file-system "$WORK"
		fi
	fi
	# Verify.
	for n in "${CREATED_NS[@]}"; do netns_exists "$n" && { warn "namespace $n is still there"; leftovers=1; }; done
	for n in "${CREATED_BR[@]}"; do ip link show "$n" >/dev/null 2>&1 && { warn "link $n is still there"; leftovers=1; }; done
	for entry in "${CLEAN_NETS[@]}"; do
		read -r net _ <<<"$entry"
		if iptables -w -t nat -S | grep -q -- "$net" || iptables -w -S | grep -q -- "$net"; then
			warn "iptables rules for $net are still there"
			leftovers=1
		fi
	done
	if [[ $leftovers -eq 0 ]]; then
		say "nothing left behind"
	elif [[ $rc -eq 0 ]]; then
		rc=1
		printf '%sDEMO FAILED:%s could not clean up everything (see warnings above)\n' "$RED" "$RESET" >&2
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

WORK=$(mktemp -d "${TMPDIR:-/tmp}/nbc-demo.XXXXXX")
NETCONF=$WORK/net.d                     # NETCONFPATH for cnitool
PERSIST=$WORK/var-lib-cni-networks      # stands in for /var/lib/cni/networks (on disk)
RUN_MNT=$WORK/run-cni                   # stands in for /var/run/cni (tmpfs)
mkdir -p "$NETCONF" "$PERSIST" "$RUN_MNT"

# --------------------------------------------------------------- helpers ---
# The conflists are conflist/nomad.conflist with the network name, bridge name,
# subnet and dataDir patched; the control ("bare") uses "type": "bridge" and
# keeps host-local's leases in $PERSIST as upstream does.
write_conflists() {
	if command -v jq >/dev/null 2>&1 && jq --version >/dev/null 2>&1; then
		# shellcheck disable=SC2016 # $vars are jq's
		local patch='.name = $name
			| .plugins |= map(if .type == "nomad-bridge-cni" then
				.bridge = $br | .ipam.ranges = [[{"subnet": $subnet}]] | .dataDir = $dd
				| if $bare == "1" then .type = "bridge" | del(.dataDir, .delegate) | .ipam.dataDir = $dd else . end
			else . end)'
		jq --arg name "$NET_BARE" --arg br "$BR_BARE" --arg subnet "$SUBNET_BARE" --arg dd "$PERSIST" \
			--arg bare 1 "$patch" "$TEMPLATE" >"$NETCONF/10-bare.conflist"
		jq --arg name "$NET_PLUGIN" --arg br "$BR_PLUGIN" --arg subnet "$SUBNET_PLUGIN" --arg dd "$RUN_MNT" \
			--arg bare 0 "$patch" "$TEMPLATE" >"$NETCONF/20-plugin.conflist"
	else
		heredoc_conflist "$NET_BARE" bridge "" "$BR_BARE" "$SUBNET_BARE" "\"dataDir\": \"$PERSIST\"," >"$NETCONF/10-bare.conflist"
		heredoc_conflist "$NET_PLUGIN" nomad-bridge-cni "\"dataDir\": \"$RUN_MNT\"," "$BR_PLUGIN" "$SUBNET_PLUGIN" "" >"$NETCONF/20-plugin.conflist"
	fi
}
# Without jq: the same content as conflist/nomad.conflist, written out.
heredoc_conflist() { # name type datadir-line bridge subnet ipam-datadir-line
	cat <<EOF
{
  "cniVersion": "0.4.0",
  "name": "$1",
  "plugins": [
    { "type": "loopback" },
    {
      "type": "$2", $3
      "bridge": "$4",
      "ipMasq": true,
      "isGateway": true,
      "forceAddress": true,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local", $6
        "ranges": [ [ { "subnet": "$5" } ] ],
        "routes": [ { "dst": "0.0.0.0/0" } ]
      }
    },
    { "type": "firewall", "backend": "iptables", "iptablesAdminChainName": "NOMAD-ADMIN" },
    { "type": "portmap", "capabilities": { "portMappings": true }, "snat": true }
  ]
}
EOF
}

cnitool() { # verb network netns-name
	cmdline "cnitool $1 $2 $NETNS_DIR/$3"
	env -u CNI_ARGS -u CAP_ARGS -u CNI_IFNAME -u CNI_COMMAND CNI_PATH="$BIN" NETCONFPATH="$NETCONF" \
		"$BIN/cnitool" "$1" "$2" "$NETNS_DIR/$3"
}
create_netns() {
	cmdline "ip netns add $1"
	ip netns add "$1"
	CREATED_NS+=("$1")
}
ns_addr() { ip -n "$1" -4 -o addr show dev eth0 2>/dev/null | awk '{print $4}' | head -n1; }
ns_gw() { ip -n "$1" -4 route show default 2>/dev/null | awk '{print $3}' | head -n1; }
show_lease() { # dir ip
	printf '%s:\n' "$1/${2%/*}"
	cat "$1/${2%/*}"
	echo
}
# A reboot kills every network namespace and all kernel network state (the
# veth, the bridge, the iptables rules) and empties tmpfs (/run); files on disk
# survive. The runtime then re-creates the netns at the same path and ADDs
# again under the same container ID, without a DEL.
simulate_reboot() { # netns bridge net subnet cid [remount]
	local n
	say "deleting namespace $1 WITHOUT a CNI DEL (the netns and its veth die with the boot)"
	cmdline "ip netns delete $1"
	ip netns delete "$1"
	say "deleting bridge $2 and the iptables rules of $3 (kernel state dies with the boot too)"
	cmdline "ip link delete $2"
	delete_bridge "$2"
	n=$(purge_iptables "$3" "$4" "$5")
	say "(removed $n)"
	if [[ ${6:-} == remount ]]; then
		say "emptying /run: unmount and re-mount the tmpfs that holds the plugin's dataDir"
		cmdline "umount $RUN_MNT && mount -t tmpfs ... $RUN_MNT"
		umount "$RUN_MNT"
		mount -t tmpfs -o size=16m,mode=0755 "nbc-demo-$SUFFIX" "$RUN_MNT"
		say "files under $RUN_MNT after the \"reboot\": $(find "$RUN_MNT" -mindepth 1 | wc -l)"
	fi
	say "the runtime re-creates the namespace at the same path, so the container ID is unchanged"
	create_netns "$1"
}

# ================================================================== start ===
printf '%snomad-bridge-cni demo%s: the host-local "duplicate allocation" bug after a reboot, and the fix\n' "$BOLD" "$RESET"
say "plugins:      $BIN"
say "plugin:       $(timeout 10 "$BIN/nomad-bridge-cni" </dev/null 2>&1 | head -n1 || true)"
say "work dir:     $WORK"

step "Prepare: a tmpfs for the plugin's dataDir, a plain on-disk dir for the control, two conflists"
mount -t tmpfs -o size=16m,mode=0755 "nbc-demo-$SUFFIX" "$RUN_MNT"
say "tmpfs mounted at $RUN_MNT (filesystem: $(stat -f -c %T "$RUN_MNT")): stands in for /var/run/cni, emptied by every boot"
say "on-disk dir   $PERSIST (filesystem: $(stat -f -c %T "$PERSIST")): stands in for /var/lib/cni/networks, host-local's default"
CLEAN_NETS+=("$NET_BARE $SUBNET_BARE $CID_BARE" "$NET_PLUGIN $SUBNET_PLUGIN $CID_PLUGIN" "$NET_PLUGIN $SUBNET_PLUGIN $CID_DEAD")
write_conflists
say "both are $TEMPLATE (Nomad's bridge chain: loopback, bridge, firewall, portmap; cniVersion 0.4.0)"
say "with the name, bridge, subnet and dataDir made unique to this run:"
say "  $NETCONF/10-bare.conflist    network $NET_BARE, bridge $BR_BARE, $SUBNET_BARE"
say "      \"type\": \"bridge\", \"ipam\": {\"dataDir\": \"$PERSIST\"}     (upstream: leases on disk)"
say "  $NETCONF/20-plugin.conflist  network $NET_PLUGIN, bridge $BR_PLUGIN, $SUBNET_PLUGIN"
say "      \"type\": \"nomad-bridge-cni\", \"dataDir\": \"$RUN_MNT\"     (the fix: leases on tmpfs)"

# ================================================================= part 1 ===
part "Part 1: the bug, with the bare bridge chain (leases on disk)"

step "Start a \"container\": create its network namespace and ADD it to $NET_BARE"
create_netns "$NS_BARE"
CREATED_BR+=("$BR_BARE")
say "container ID (cnitool derives it from the netns path): $CID_BARE"
cnitool add "$NET_BARE" "$NS_BARE" >"$WORK/add1.json" || die "the first ADD through the bare bridge chain failed (see the error above); the demo cannot reproduce the bug"
IP1=$(ns_addr "$NS_BARE")
[[ -n $IP1 ]] || die "no IPv4 address on eth0 inside $NS_BARE after ADD"
ok "the container got $IP1 (gateway $(ns_gw "$NS_BARE"))"
say "host-local wrote its lease to the on-disk dir:"
[[ -f $PERSIST/$NET_BARE/${IP1%/*} ]] || die "expected lease file $PERSIST/$NET_BARE/${IP1%/*} is missing"
show_lease "$PERSIST/$NET_BARE" "$IP1" | evidence

step "\"Reboot\" the host"
simulate_reboot "$NS_BARE" "$BR_BARE" "$NET_BARE" "$SUBNET_BARE" "$CID_BARE"
say "the lease survived on disk, still naming this container:"
show_lease "$PERSIST/$NET_BARE" "$IP1" | evidence

step "Restore the container: ADD again under the same container ID"
PART1_OK=0
if ERR1=$(cnitool add "$NET_BARE" "$NS_BARE" 2>&1); then
	say "the ADD succeeded: the container got $(ns_addr "$NS_BARE")"
	warn "the bare chain did NOT fail after the reboot, so the bug was not reproduced"
else
	errtext "$ERR1" | evidence
	if grep -q "duplicate allocation is not allowed" <<<"$ERR1"; then
		PART1_OK=1
		ok "the bare chain failed the upstream way: host-local refuses because of the stale on-disk lease"
		say "(this is what kills a Nomad allocation restored after a reboot)"
	else
		warn "the ADD failed, but not with \"duplicate allocation is not allowed\""
	fi
fi
say "tidying up part 1 before part 2"
delete_netns "$NS_BARE"
delete_bridge "$BR_BARE"
purge_iptables "$NET_BARE" "$SUBNET_BARE" "$CID_BARE" >/dev/null
rm -f "$CNI_CACHE/results/$NET_BARE"-*

# ================================================================= part 2 ===
part "Part 2: the same, with nomad-bridge-cni (leases on tmpfs)"

step "Start a \"container\": create its network namespace and ADD it to $NET_PLUGIN"
create_netns "$NS_PLUGIN"
CREATED_BR+=("$BR_PLUGIN")
say "container ID: $CID_PLUGIN"
cnitool add "$NET_PLUGIN" "$NS_PLUGIN" >"$WORK/add2.json" || die "the first ADD through nomad-bridge-cni failed (see the error above)"
IP2=$(ns_addr "$NS_PLUGIN")
[[ -n $IP2 ]] || die "no IPv4 address on eth0 inside $NS_PLUGIN after ADD"
ok "the container got $IP2 (gateway $(ns_gw "$NS_PLUGIN"))"
LEASE2=$RUN_MNT/$NET_PLUGIN/${IP2%/*}
[[ -f $LEASE2 ]] || die "expected lease file $LEASE2 (on the tmpfs dataDir) is missing"
say "host-local wrote its lease to the tmpfs dataDir:"
show_lease "$RUN_MNT/$NET_PLUGIN" "$IP2" | evidence
say "everything on the tmpfs:"
(cd "$RUN_MNT" && find . -mindepth 1 -printf "%P\n" | sort) | evidence
[[ ! -e $CNI_CACHE/networks/$NET_PLUGIN ]] || die "the plugin wrote leases to $CNI_CACHE/networks/$NET_PLUGIN"
ok "nothing under $CNI_CACHE/networks/$NET_PLUGIN"

step "\"Reboot\" the host"
simulate_reboot "$NS_PLUGIN" "$BR_PLUGIN" "$NET_PLUGIN" "$SUBNET_PLUGIN" "$CID_PLUGIN" remount
[[ ! -e $LEASE2 ]] || die "the lease $LEASE2 survived the tmpfs re-mount"
ok "the lease is gone with the tmpfs, as it would be after a real boot"

step "Restore the container: ADD again under the same container ID ($CID_PLUGIN)"
if ! OUT2=$(cnitool add "$NET_PLUGIN" "$NS_PLUGIN" 2>&1); then
	errtext "$OUT2" | evidence
	die "the re-ADD through nomad-bridge-cni failed"
fi
IP2B=$(ns_addr "$NS_PLUGIN")
GW2=$(ns_gw "$NS_PLUGIN")
[[ -n $IP2B && -n $GW2 ]] || die "no IPv4 address or default route inside $NS_PLUGIN after the re-ADD"
ok "the restored container got $IP2B (gateway $GW2)"
[[ -f $RUN_MNT/$NET_PLUGIN/${IP2B%/*} ]] || die "expected lease file $RUN_MNT/$NET_PLUGIN/${IP2B%/*} is missing"
show_lease "$RUN_MNT/$NET_PLUGIN" "$IP2B" | evidence

step "Connectivity: ping the gateway from inside the container's namespace"
cmdline "ip netns exec $NS_PLUGIN ping -c1 -W2 $GW2"
if ! PING=$(ip netns exec "$NS_PLUGIN" ping -c1 -W2 "$GW2" 2>&1); then
	printf '%s\n' "$PING" | evidence
	die "the restored container cannot reach its gateway $GW2 (a host firewall dropping INPUT from $BR_PLUGIN would do this: iptables -S INPUT)"
fi
printf '%s\n' "$PING" | evidence
ok "the gateway answers"

step "CHECK: what Nomad sends when it restores an allocation"
if ! OUT=$(cnitool check "$NET_PLUGIN" "$NS_PLUGIN" 2>&1); then
	errtext "$OUT" | evidence
	die "CHECK failed on the restored container"
fi
ok "CHECK passed (loopback, nomad-bridge-cni, firewall and portmap all agree)"

step "A second container dies without a DEL (a runtime that crashed): what nomad-bridge-cni-gc.timer runs releases it"
create_netns "$NS_DEAD"
cnitool add "$NET_PLUGIN" "$NS_DEAD" >"$WORK/add3.json" || die "the ADD of a second container through nomad-bridge-cni failed (see the error above)"
IP3=$(ns_addr "$NS_DEAD")
[[ -n $IP3 && -f $RUN_MNT/$NET_PLUGIN/${IP3%/*} ]] || die "no address or no lease for the second container"
ok "the second container got $IP3; its namespace is deleted, and nobody sends DEL"
cmdline "ip netns delete $NS_DEAD"
ip netns delete "$NS_DEAD"
say "the packages' nomad-bridge-cni-gc.timer runs this every 5 minutes (here with the demo's dataDir):"
cmdline "nomad-bridge-cni gc --all-data-dirs --data-dir $RUN_MNT"
if ! OUT=$("$BIN/nomad-bridge-cni" gc --all-data-dirs --data-dir "$RUN_MNT" 2>&1); then
	printf '%s\n' "$OUT" | evidence
	die "the timer's gc failed"
fi
printf '%s\n' "$OUT" | evidence
grep -qF "released $NET_PLUGIN $CID_DEAD/eth0 ${IP3%/*}: namespace" <<<"$OUT" || die "the timer's gc did not release the dead container"
[[ ! -e $RUN_MNT/$NET_PLUGIN/${IP3%/*} ]] || die "the dead container's lease ${IP3%/*} is still there after the gc"
if iptables -w -t nat -S POSTROUTING | grep -qF -- "id: \"$CID_DEAD\""; then
	die "the gc left bridge's masquerade rule of the dead container"
fi
ok "its lease ${IP3%/*} and its masquerade rule are gone; the live container keeps $IP2B"
[[ -f $RUN_MNT/$NET_PLUGIN/${IP2B%/*} ]] || die "the gc released the live container's lease"

step "Stop the container: DEL releases the lease"
if ! OUT=$(cnitool del "$NET_PLUGIN" "$NS_PLUGIN" 2>&1); then
	errtext "$OUT" | evidence
	die "DEL failed"
fi
[[ ! -e $RUN_MNT/$NET_PLUGIN/${IP2B%/*} ]] || die "the lease $RUN_MNT/$NET_PLUGIN/${IP2B%/*} is still there after DEL"
ok "lease $RUN_MNT/$NET_PLUGIN/${IP2B%/*} is gone; what is left on the tmpfs:"
(cd "$RUN_MNT" && find . -mindepth 1 -printf "%P\n" | sort) | evidence
if iptables -w -t nat -S POSTROUTING | grep -q -- "$NET_PLUGIN"; then
	die "DEL left bridge's masquerade rule for $NET_PLUGIN in nat POSTROUTING"
fi
ok "bridge's masquerade rule for $NET_PLUGIN is gone too"

# ================================================================ verdict ===
part "Result"
if [[ $PART1_OK -eq 1 ]]; then
	ok "bare bridge chain:  re-ADD after the reboot failed with \"duplicate allocation is not allowed\" (the bug)"
	ok "nomad-bridge-cni:   re-ADD after the reboot succeeded, gateway reachable, CHECK and DEL pass (the fix)"
else
	ok "nomad-bridge-cni:   re-ADD after the reboot succeeded, gateway reachable, CHECK and DEL pass"
	die "part 1 did not reproduce the upstream failure (\"duplicate allocation is not allowed\") with the bare bridge chain, so the demo proves nothing"
fi
