#!/bin/bash
# test/reboot/guest-driver.sh: the reboot test's driver, run INSIDE the guest at every
# boot by /sbin/nbc-init (see guest-init.sh), which systemd runs as nomad.service, from
# the read-only share /mnt/nbc/test; the plugins come from the read-only share
# /mnt/nbc/bin, the release's .deb from the test share.
#
# The package steps, under systemd:
#   phase 1  dpkg -i the .deb: its postinst enables the gc and metrics timers and the
#            boot sweep, and starts the timers; /etc/default/nomad-bridge-cni points
#            the units' gc at a third persistent dataDir (/var/lib/nbc-bootsweep), where
#            an allocation on network nomad-boot is ADDed and left for the reboot.
#   phase 2  nomad-bridge-cni-boot.service ran, succeeded and ended before nomad.service
#            (this driver) started; the allocation's lease and record were gone before
#            the driver's first ADD; this boot's journal has the release; the timers
#            are listed.
#
# A phase marker on the guest's persistent disk (/var/lib/nbc-reboot-test/phase) tells
# the boots apart:
#   phase 1  install the plugins and Nomad's conflist at the real paths; ADD two
#            "allocations" (netns /var/run/netns/<alloc id>, one with a port mapping)
#            through Nomad's chain with our plugin, check connectivity and CHECK; ADD a
#            control allocation through the same chain with a bare "bridge" (host-local's
#            default, persistent dataDir /var/lib/cni/networks); then exit 100: nbc-init
#            reboots the VM for real.
#   phase 2  verify it really rebooted (/run empty, namespaces, links and rules gone,
#            /var/lib kept); restore the allocations as Nomad does: the same netns
#            paths, hence the same container IDs, ADD again without a DEL; it must
#            succeed, connect and CHECK; the control's re-ADD must fail with "duplicate
#            allocation is not allowed"; then DEL everything and verify nothing is left.
#
# The GC steps add a second network, nomad-persist: Nomad's chain again, with
# our plugin's dataDir on the guest's ext4 disk (/var/lib/nbc-persist: a host whose /run
# is not tmpfs, or an operator who chose a persistent dataDir). Its leases and records
# survive the reboot; the sweeps must prove them stale and reclaim them:
#   phase 1  ADD P1 and P2 on it (the first ADD warns that the dataDir is not on tmpfs,
#            the second does not: once per boot and network);
#            `leases` shows them live and a `gc` keeps them (and Nomad's two).
#   phase 2  `leases` shows both stale ("recorded in an earlier boot"), `gc --dry-run`
#            changes nothing; P1 is restored (its netns re-created, ADD without DEL:
#            the stale record is released first, one lease); P2's job was stopped while
#            the node was down, so nobody restores it: CHECK of P1 releases it, and a
#            second sweep (`gc`) has nothing to release. After the restore of Nomad's
#            allocations a `gc` keeps them; after the DELs, a `gc --orphan-rules` of
#            both dataDirs has nothing to release and nothing of P1/P2 is left.
#
# Output goes to the serial console; the host (run.sh) watches for the lines
#   NBC-PHASE <n> BEGIN | NBC-PHASE 1 END | NBC-RESULT: PASS | NBC-RESULT: FAIL ...
# A failed check is recorded (NBC-CHECK-FAIL, kept on disk across the reboot) and the
# test goes on where that still makes sense, so one run shows every failure; a failed
# precondition ends the run at once. Every external command has a timeout.
set -uo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

SHARE=/mnt/nbc/test
SRC_BIN=/mnt/nbc/bin
STATE=/var/lib/nbc-reboot-test # persistent: phase marker, failures, boot id
export CNI_PATH=/opt/cni/bin
export NETCONFPATH=/etc/cni/net.d
CNI_CACHE=/var/lib/cni # libcni's cache (cnitool's results), persistent
NETNS_DIR=/var/run/netns
PLUGINS="nomad-bridge-cni bridge host-local loopback firewall portmap"

# Nomad's chain, verbatim from conflist/nomad.conflist (shared by run.sh).
NET=$(jq -r .name "$SHARE/nomad.conflist")
DATA_DIR=$(jq -r '[.plugins[] | select(.type == "nomad-bridge-cni")][0].dataDir // "/var/run/cni"' "$SHARE/nomad.conflist")
BRIDGE=$(jq -r '[.plugins[] | select(.type == "nomad-bridge-cni")][0].bridge // "cni0"' "$SHARE/nomad.conflist")
LEASES=$DATA_DIR/$NET                    # host-local's directory under our dataDir (tmpfs)
LEGACY_LEASES=/var/lib/cni/networks/$NET # where bare bridge would have put them
# The control: the same chain with the bare "bridge" type, its own name, bridge and subnet.
CTL_NET=nomad-control
CTL_BRIDGE=nomadctl
CTL_SUBNET=172.26.96.0/20
CTL_LEASES=/var/lib/cni/networks/$CTL_NET
# The GC steps' network: the same chain with our plugin, its dataDir on the persistent disk.
P_NET=nomad-persist
P_BRIDGE=nomadp
P_SUBNET=172.26.112.0/20
P_DATA_DIR=/var/lib/nbc-persist
P_LEASES=$P_DATA_DIR/$P_NET
P_RECORDS=$P_DATA_DIR/.nomad-bridge-cni/$P_NET # our attachment records
EARLIER_BOOT="recorded in an earlier boot"     # the reason a sweep gives for them
# The package's units, under systemd (PID 1 of the guest; this driver runs as
# nomad.service, which the boot sweep is ordered before). The boot sweep's network:
# the same chain, its dataDir on the persistent disk, and /etc/default/nomad-bridge-cni
# pointing the units' gc at that dataDir only (nomad-persist's stale state is for the
# plugin's own sweeps of phase 2).
B_NET=nomad-boot
B_BRIDGE=nomadbt
B_SUBNET=172.26.128.0/20
B_DATA_DIR=/var/lib/nbc-bootsweep
B_LEASES=$B_DATA_DIR/$B_NET
B_RECORDS=$B_DATA_DIR/.nomad-bridge-cni/$B_NET
NBC_UNITS="nomad-bridge-cni-gc.timer nomad-bridge-cni-metrics.timer nomad-bridge-cni-boot.service"

# Allocation IDs, used as netns names as Nomad does; cnitool derives the container ID
# from the netns path, so a netns re-created at the same path gets the same ID.
ALLOC_A=0dc525f4-c491-7e25-a67d-0121069ad55e
ALLOC_B=7f3b9a2e-51c4-4d0b-9e1a-2c6d8f4e0b17 # the one with a port mapping
ALLOC_C=c0a1c0a1-0000-4000-8000-00000000c0de # the control (bare bridge)
ALLOC_P1=5e1f0c2d-6a7b-4c8d-9e0f-1a2b3c4d5e61  # nomad-persist, restored after the reboot
ALLOC_P2=5e1f0c2d-6a7b-4c8d-9e0f-1a2b3c4d5e62  # nomad-persist, never restored (job stopped)
ALLOC_BOOT=b0075eed-0000-4000-8000-0000000b0075 # nomad-boot, left for the boot sweep
HOST_PORT=8080
PORTMAP_B='{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}'

# ---------------------------------------------------------------- output ---
PHASE='?'
log() { printf '[phase %s %6ss] %s\n' "$PHASE" "$(cut -d' ' -f1 /proc/uptime)" "$*"; }
step() { printf '\n'; log "== $*"; }
indent() { sed -e 's/\r$//' -e 's/^/      | /'; }
OUT= # output of the last run()
ERR= # stderr of the last run_split() (run() mixes it into $OUT)
run() { # seconds, command...: echo, run with a timeout, show its output, keep it in $OUT
	local limit=$1 rc
	shift
	printf '    $ %s\n' "$*"
	ERR=
	OUT=$(timeout -k 5 "$limit" "$@" 2>&1)
	rc=$?
	[[ -n $OUT ]] && printf '%s\n' "$OUT" | indent
	[[ $rc == 124 || $rc == 137 ]] && printf '    (timed out after %ss)\n' "$limit"
	[[ $rc != 0 ]] && printf '    (exit %s)\n' "$rc"
	return $rc
}
run_split() { # like run, with stdout in $OUT and stderr in $ERR (shown as "! ...")
	local limit=$1 rc errf=/run/nbc-stderr
	shift
	printf '    $ %s\n' "$*"
	OUT=$(timeout -k 5 "$limit" "$@" 2>"$errf")
	rc=$?
	ERR=$(cat "$errf" 2>/dev/null)
	rm -f "$errf"
	[[ -n $OUT ]] && printf '%s\n' "$OUT" | indent
	[[ -n $ERR ]] && printf '%s\n' "$ERR" | sed -e 's/\r$//' -e 's/^/      ! /'
	[[ $rc == 124 || $rc == 137 ]] && printf '    (timed out after %ss)\n' "$limit"
	[[ $rc != 0 ]] && printf '    (exit %s)\n' "$rc"
	return $rc
}
fail() { # a failed check: recorded, the test goes on
	echo "NBC-CHECK-FAIL: [phase $PHASE] $*"
	echo "[phase $PHASE] $*" >>"$STATE/failures"
}
pass() { echo "    OK $*"; }
finish() { # print the verdict; nbc-init powers the VM off
	step "verdict"
	echo "[phase $PHASE] finished" >>"$STATE/phase-log"
	echo "done" >"$STATE/phase"
	sync
	if [[ -s $STATE/failures ]]; then
		echo "failed checks:"
		indent <"$STATE/failures"
		echo "NBC-RESULT: FAIL ($(wc -l <"$STATE/failures") failed checks)"
	else
		echo "NBC-RESULT: PASS"
	fi
	exit 0
}
fatal() { # a failed precondition: nothing after it would mean anything
	fail "$*"
	finish
}

# ------------------------------------------------------------- helpers ---
netns_path() { echo "$NETNS_DIR/$1"; }
cid() { # the container ID cnitool derives from a netns path
	printf 'cnitool-%s' "$(printf '%s' "$(netns_path "$1")" | sha512sum | cut -c1-20)"
}
hash_name() { # prefix, length, network, container ID: utils.MustFormatHashWithPrefix
	printf '%s%s' "$1" "$(printf '%s%s' "$3" "$4" | sha512sum)" | cut -c1-"$2"
}
masq_chain() { hash_name CNI- 28 "$1" "$2"; } # bridge's ipMasq chain
dnat_chain() { hash_name CNI-DN- 28 "$1" "$2"; } # portmap's per-container chain
cni() { # op, network, alloc, [CAP_ARGS]
	CAP_ARGS=${4:-} run 60 cnitool "$1" "$2" "$(netns_path "$3")"
}
cni_error() { # the error line of the last cnitool run
	printf '%s\n%s\n' "$OUT" "$ERR" | grep -m1 -E "Error|failed" | sed -e "s/^Error: //" | cut -c1-300
}
result_ip() { jq -r '.ips[0].address | split("/")[0]' <<<"$1" 2>/dev/null; }
result_gw() { jq -r '.ips[0].gateway // empty' <<<"$1" 2>/dev/null; }
is_ip_name() { [[ $1 =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ || $1 =~ ^[0-9a-fA-F:]+:[0-9a-fA-F:]*$ ]]; }
lease_files() { # dir: the files host-local names after an IP
	local f
	[[ -d $1 ]] || return 0
	for f in "$1"/*; do
		[[ -f $f ]] && is_ip_name "${f##*/}" && echo "$f"
	done
	return 0
}
ping_from() { # alloc, address
	run 20 ip netns exec "$1" ping -c 3 -i 0.2 -W 2 "$2"
}
masq_jumps() { # the nat POSTROUTING rules, comments unescaped (iptables -S prints name: \"net\")
	timeout 10 iptables -t nat -S POSTROUTING | sed -e "s/[\\]//g"
}
http_get() { # address, port: GET / over plain bash /dev/tcp (busybox-static's wget crashes)
	# shellcheck disable=SC2016 # expanded by the inner bash
	run 15 bash -c 'exec 3<>"/dev/tcp/$1/$2" && printf "GET / HTTP/1.0\r\n\r\n" >&3 && cat <&3' _ "$1" "$2"
}

# An "allocation": add the netns, ADD it through a network, check what it got.
declare -A IP=() GW=()
add_alloc() { # alloc, network, [CAP_ARGS]; sets IP[alloc], GW[alloc]; returns ADD's status
	local a=$1 net=$2 cap=${3:-}
	run 10 ip netns add "$a" || return 1
	cni add "$net" "$a" "$cap" || return 1
	IP[$a]=$(result_ip "$OUT")
	GW[$a]=$(result_gw "$OUT")
	[[ -n ${IP[$a]} && ${IP[$a]} != null ]] || {
		fail "ADD $net/$a printed no IP address"
		return 1
	}
	echo "    $a: container ID $(cid "$a"), IP ${IP[$a]}, gateway ${GW[$a]}"
}

# What our plugin's ADD must have left, for an allocation on Nomad's network.
check_attached() { # alloc, [expect a port mapping]
	local a=$1 id lease
	id=$(cid "$a")
	lease=$LEASES/${IP[$a]}
	if [[ -f $lease ]] && [[ $(head -n1 "$lease" | tr -d '\r') == "$id" ]]; then
		pass "lease $lease holds $id"
	else
		fail "no lease for $a at $lease (our dataDir on tmpfs); legacy dir $LEGACY_LEASES has: $(lease_files "$LEGACY_LEASES" | tr '\n' ' ')"
	fi
	if masq_jumps | grep -qF "name: \"$NET\" id: \"$id\""; then
		pass "ipMasq POSTROUTING jump for $a"
	else
		fail "no ipMasq POSTROUTING jump commented for $NET/$a"
	fi
	if [[ -n ${2:-} ]]; then
		if iptables -t nat -S | grep -q -- "^-N $(dnat_chain "$NET" "$id")\$"; then
			pass "portmap chain $(dnat_chain "$NET" "$id") for $a"
		else
			fail "no portmap chain CNI-DN-... for $NET/$a"
		fi
	fi
}

check_connectivity() { # alloc...: each pings its gateway; the first two ping each other
	local a
	for a in "$@"; do
		if ping_from "$a" "${GW[$a]}"; then pass "$a reaches its gateway ${GW[$a]}"; else fail "$a cannot ping its gateway ${GW[$a]}"; fi
	done
	if [[ $# -ge 2 ]]; then
		if ping_from "$1" "${IP[$2]}"; then pass "$1 reaches $2 (${IP[$2]})"; else fail "$1 cannot ping $2 (${IP[$2]})"; fi
	fi
}

# The task behind the port mapping: an HTTP server on port 80 in the allocation's netns,
# reached from the host through portmap's DNAT on hostPort (the seed's job: port "http"
# to = 80). The server dies with the netns's last process, or with the boot.
check_port_mapping() { # alloc
	local a=$1 www=/run/nbc-www-$1
	mkdir -p "$www"
	echo "hello from $a" >"$www/index.html"
	run 10 ip netns exec "$a" busybox httpd -p 80 -h "$www" || {
		fail "cannot start the HTTP server in $a"
		return
	}
	if http_get "${GW[$a]}" "$HOST_PORT" && grep -q "^hello from $a" <<<"$OUT"; then
		pass "host port $HOST_PORT reaches $a:80 through portmap"
	else
		fail "host port $HOST_PORT does not reach $a:80 through portmap"
	fi
}
stop_tasks() { # alloc...: kill what runs in the netns (before DEL, as Nomad stops tasks)
	local a p
	for a in "$@"; do
		for p in $(ip netns pids "$a" 2>/dev/null); do kill "$p" 2>/dev/null; done
	done
	sleep 0.2
}

# ------------------------------------------- GC steps: the persistent network ---
p_cni() { # op, alloc, [network]: cnitool on $P_NET (or network), stdout in $OUT, stderr (the plugin's log) in $ERR
	run_split 60 cnitool "$1" "${3:-$P_NET}" "$(netns_path "$2")"
}
p_add() { # alloc, [network]; like add_alloc, on $P_NET (or network), keeping the plugin's stderr apart from the result
	local a=$1 net=${2:-$P_NET}
	run 10 ip netns add "$a" || return 1
	p_cni add "$a" "$net" || return 1
	IP[$a]=$(result_ip "$OUT")
	GW[$a]=$(result_gw "$OUT")
	[[ -n ${IP[$a]} && ${IP[$a]} != null ]] || {
		fail "ADD $net/$a printed no IP address"
		return 1
	}
	echo "    $a: container ID $(cid "$a"), IP ${IP[$a]}, gateway ${GW[$a]}"
}
nbc() { # the operator CLI: nomad-bridge-cni leases|gc ...
	run_split 30 "$CNI_PATH/nomad-bridge-cni" "$@"
}
leases_of() { # container ID: "state|reason|ip" of its rows in the last `leases --json` ($OUT)
	jq -r --arg id "$1" '[.leases[] | select(.containerID == $id) | "\(.state)|\(.reason // "")|\(.ip)"] | join(" ")' <<<"$OUT" 2>/dev/null
}
leases_held_by() { # dir, container ID: the lease files whose first line is that ID
	local f
	for f in $(lease_files "$1"); do
		[[ $(head -n1 "$f" | tr -d '\r') == "$2" ]] && echo "$f"
	done
	return 0
}
record_of() { # alloc: our record of its attachment on $P_NET
	echo "$P_RECORDS/$(cid "$1")@eth0"
}
expect_nothing_to_release() { # what: the last `gc` ($OUT) released nothing
	if grep -qx "nothing to release" <<<"$OUT" && ! grep -q "released" <<<"$OUT$ERR"; then
		pass "$1: nothing to release"
	else
		fail "$1 released something or failed: $(tr '\n' ' ' <<<"$OUT $ERR" | cut -c1-400)"
	fi
}
released_in_err() { # container ID, IP: the last run_split's stderr has the plugin's release line
	# "nomad-bridge-cni: <net>: released <cid>/eth0 <ips>: recorded in an earlier boot; removed ..."
	# (<ips> as the lease or the record has them: with or without the prefix length)
	grep -qE "^nomad-bridge-cni: $P_NET: released $1/eth0 ${2//./\\.}(/[0-9]+)?: $EARLIER_BOOT;" <<<"$ERR"
}
tree_state() { # dir: every entry (type, mode, size) and every file's sha256
	(cd "$1" && find . -printf '%p %y %m %s\n' | sort && find . -type f -exec sha256sum {} + | sort -k2) 2>&1
}

persistent_conflist() { # name, bridge, subnet, dataDir, file: Nomad's chain with the plugin's dataDir there
	jq --arg name "$1" --arg br "$2" --arg subnet "$3" --arg dd "$4" '
		.name = $name
		| .plugins |= map(if .type == "nomad-bridge-cni"
			then (.bridge = $br | .dataDir = $dd | .ipam.ranges = [[{subnet: $subnet}]])
			else . end)' "$SHARE/nomad.conflist" >"$5" || fatal "cannot write the $1 conflist"
}
setup_host() { # plugins at Nomad's cni_path, conflists at its cni_config_dir
	mkdir -p "$CNI_PATH" "$NETCONFPATH"
	local p
	for p in $PLUGINS; do
		install -m 0755 "$SRC_BIN/$p" "$CNI_PATH/$p" || fatal "cannot install $SRC_BIN/$p"
	done
	install -m 0755 "$SRC_BIN/cnitool" /usr/local/bin/cnitool || fatal "cannot install cnitool"
	install -m 0644 "$SHARE/nomad.conflist" "$NETCONFPATH/10-$NET.conflist"
	# The control chain: Nomad's, with the bare "bridge" type and no dataDir anywhere, so
	# host-local keeps its leases in its default, persistent /var/lib/cni/networks.
	jq --arg name "$CTL_NET" --arg br "$CTL_BRIDGE" --arg subnet "$CTL_SUBNET" '
		.name = $name
		| .plugins |= map(if .type == "nomad-bridge-cni"
			then (.type = "bridge" | del(.dataDir) | del(.delegate) | .bridge = $br
				| del(.ipam.dataDir) | .ipam.ranges = [[{subnet: $subnet}]])
			else . end)' "$SHARE/nomad.conflist" >"$NETCONFPATH/20-$CTL_NET.conflist" ||
		fatal "cannot write the control conflist"
	echo "    $NETCONFPATH/20-$CTL_NET.conflist:"
	indent <"$NETCONFPATH/20-$CTL_NET.conflist"
	# The GC steps' network: Nomad's chain with our plugin, its own name, bridge and
	# subnet, and the plugin's dataDir on the persistent disk.
	persistent_conflist "$P_NET" "$P_BRIDGE" "$P_SUBNET" "$P_DATA_DIR" "$NETCONFPATH/30-$P_NET.conflist"
	echo "    $NETCONFPATH/30-$P_NET.conflist (the plugin's part):"
	jq '.plugins[] | select(.type == "nomad-bridge-cni")' "$NETCONFPATH/30-$P_NET.conflist" | indent
	persistent_conflist "$B_NET" "$B_BRIDGE" "$B_SUBNET" "$B_DATA_DIR" "$NETCONFPATH/40-$B_NET.conflist"
	run 5 "$CNI_PATH/nomad-bridge-cni" # the version line Nomad fingerprints
}

# ============================================================== phase 1 ===
phase1() {
	PHASE=1
	mkdir -p "$STATE"
	: >"$STATE/failures"
	echo "NBC-PHASE 1 BEGIN"
	step "first boot: boot_id $(cat /proc/sys/kernel/random/boot_id)"
	cat /proc/sys/kernel/random/boot_id >"$STATE/boot_id"
	run 5 stat -f -c '/run is on %T' /run
	[[ $(stat -f -c %T /run) == tmpfs ]] || fatal "/run is not a tmpfs in the guest"
	[[ $(readlink -f /var/run) == /run ]] || fatal "/var/run is not /run in the guest"

	step "install the .deb under systemd: its postinst enables and starts the units"
	run 5 cat /proc/1/comm
	[[ $OUT == systemd ]] || fatal "PID 1 is not systemd: the package's units prove nothing"
	local deb
	deb=$(ls "$SHARE"/nomad-bridge-cni_*_amd64.deb 2>/dev/null | head -n1)
	[[ -n $deb ]] || fatal "no .deb in the test share"
	run 120 dpkg -i "$deb" || fatal "dpkg -i $deb failed"
	run 10 systemctl is-enabled $NBC_UNITS
	if [[ $(tr '\n' ' ' <<<"$OUT") == "enabled enabled enabled " ]]; then pass "postinst enabled $NBC_UNITS"; else fail "postinst did not enable the units: $OUT"; fi
	run 10 systemctl list-timers --all --no-pager 'nomad-bridge-cni-*'
	for t in nomad-bridge-cni-gc.timer nomad-bridge-cni-metrics.timer; do
		if grep -qF "$t" <<<"$OUT" && [[ $(systemctl is-active "$t") == active ]]; then pass "$t is listed and active"; else fail "$t is not listed or not active after the install"; fi
	done
	# An administrator's setting, in the package's conffile.
	printf 'NBC_GC_FLAGS="--data-dir %s"\n' "$B_DATA_DIR" >/etc/default/nomad-bridge-cni

	step "install the plugins at $CNI_PATH and the conflists at $NETCONFPATH"
	setup_host

	step "boot sweep: an allocation on $B_NET ($B_DATA_DIR, persistent) left running across the reboot"
	p_add "$ALLOC_BOOT" "$B_NET" || fatal "ADD $B_NET/$ALLOC_BOOT failed: $(cni_error)"
	[[ -f $B_LEASES/${IP[$ALLOC_BOOT]} && -f $B_RECORDS/$(cid "$ALLOC_BOOT")@eth0 ]] ||
		fatal "no lease or record of $ALLOC_BOOT in $B_DATA_DIR: the boot sweep proves nothing"
	echo "$ALLOC_BOOT ${IP[$ALLOC_BOOT]}" >"$STATE/boot-sweep-ip"
	pass "$ALLOC_BOOT holds ${IP[$ALLOC_BOOT]} in $B_LEASES"

	step "ADD two allocations through Nomad's chain ($NET, with nomad-bridge-cni)"
	add_alloc "$ALLOC_A" "$NET" || fatal "ADD $NET/$ALLOC_A failed before any reboot: $(cni_error)"
	add_alloc "$ALLOC_B" "$NET" "$PORTMAP_B" || fatal "ADD $NET/$ALLOC_B failed before any reboot: $(cni_error)"
	run 5 ls -la "$LEASES"
	check_attached "$ALLOC_A"
	check_attached "$ALLOC_B" portmap
	if [[ -n $(lease_files "$LEGACY_LEASES") ]]; then
		fail "leases in the persistent $LEGACY_LEASES: $(lease_files "$LEGACY_LEASES" | tr '\n' ' ')"
	else
		pass "no lease in the persistent $LEGACY_LEASES"
	fi

	step "connectivity"
	check_connectivity "$ALLOC_A" "$ALLOC_B"
	check_port_mapping "$ALLOC_B"

	step "CHECK"
	if cni check "$NET" "$ALLOC_A"; then pass "CHECK $ALLOC_A"; else fail "CHECK $NET/$ALLOC_A failed before the reboot: $(cni_error)"; fi
	if cni check "$NET" "$ALLOC_B" "$PORTMAP_B"; then pass "CHECK $ALLOC_B"; else fail "CHECK $NET/$ALLOC_B failed before the reboot: $(cni_error)"; fi

	step "control: ADD through the same chain with the bare bridge ($CTL_NET)"
	add_alloc "$ALLOC_C" "$CTL_NET" || fatal "control ADD $CTL_NET/$ALLOC_C failed: $(cni_error)"
	ping_from "$ALLOC_C" "${GW[$ALLOC_C]}" || fail "control $ALLOC_C cannot ping its gateway"
	run 5 ls -la "$CTL_LEASES"
	[[ -f $CTL_LEASES/${IP[$ALLOC_C]} ]] || fatal "the control's lease is not in $CTL_LEASES: the control proves nothing"

	step "state that must survive the reboot"
	run 5 ls -la "$CNI_CACHE/results"

	# ---- GC steps (phase 1) -----------------------------------------------------------
	step "GC: ADD two allocations on $P_NET, whose dataDir $P_DATA_DIR is on the persistent disk"
	run 5 stat -f -c "$(dirname "$P_DATA_DIR") is on %T" "$(dirname "$P_DATA_DIR")"
	[[ $(stat -f -c %T "$(dirname "$P_DATA_DIR")") != tmpfs ]] || fatal "$(dirname "$P_DATA_DIR") is a tmpfs in the guest: the GC steps prove nothing"
	[[ ! -e $P_DATA_DIR ]] || fatal "$P_DATA_DIR exists before the first ADD"
	local a id
	# The warning comes once per boot and network: on the first ADD, not the second.
	p_add "$ALLOC_P1" || fatal "ADD $P_NET/$ALLOC_P1 failed before any reboot: $(cni_error)"
	if grep -qF "dataDir $P_DATA_DIR is not on tmpfs" <<<"$ERR"; then
		pass "the first ADD ($ALLOC_P1) warned on stderr that $P_DATA_DIR is not on tmpfs"
	else
		fail "the first ADD $P_NET/$ALLOC_P1 did not warn that $P_DATA_DIR is not on tmpfs (stderr: $(tr '\n' ' ' <<<"$ERR" | cut -c1-300))"
	fi
	p_add "$ALLOC_P2" || fatal "ADD $P_NET/$ALLOC_P2 failed before any reboot: $(cni_error)"
	if grep -qF "is not on tmpfs" <<<"$ERR"; then
		fail "the second ADD $P_NET/$ALLOC_P2 in the same boot warned again about tmpfs: $(grep -F "is not on tmpfs" <<<"$ERR" | cut -c1-300)"
	else
		pass "the second ADD ($ALLOC_P2) in the same boot did not repeat the tmpfs warning"
	fi
	: >"$STATE/persist-ips"
	for a in "$ALLOC_P1" "$ALLOC_P2"; do
		id=$(cid "$a")
		if [[ $(leases_held_by "$P_LEASES" "$id") == "$P_LEASES/${IP[$a]}" ]]; then
			pass "lease $P_LEASES/${IP[$a]} holds $id"
		else
			fail "no lease for $a at $P_LEASES/${IP[$a]} (leases of $id: $(leases_held_by "$P_LEASES" "$id" | tr '\n' ' '))"
		fi
		if [[ $(jq -r '"\(.state) \(.bootID)"' "$(record_of "$a")" 2>/dev/null) == "complete $(cat /proc/sys/kernel/random/boot_id)" ]]; then
			pass "record $(record_of "$a"): complete, this boot"
		else
			fail "no complete record of this boot at $(record_of "$a")"
		fi
		echo "$a ${IP[$a]}" >>"$STATE/persist-ips"
	done
	if ping_from "$ALLOC_P1" "${IP[$ALLOC_P2]}"; then pass "$ALLOC_P1 reaches $ALLOC_P2 (${IP[$ALLOC_P2]})"; else fail "$ALLOC_P1 cannot ping $ALLOC_P2 (${IP[$ALLOC_P2]}) on $P_NET"; fi

	step "GC before the reboot: \`leases\` shows every attachment live, \`gc\` keeps them all"
	local f live=() # the live attachments' files that are there (checked above), to be kept
	for f in "$P_LEASES/${IP[$ALLOC_P1]}" "$(record_of "$ALLOC_P1")" "$P_LEASES/${IP[$ALLOC_P2]}" "$(record_of "$ALLOC_P2")" \
		"$LEASES/${IP[$ALLOC_A]}" "$LEASES/${IP[$ALLOC_B]}"; do
		[[ -f $f ]] && live+=("$f")
	done
	nbc leases --data-dir "$P_DATA_DIR" --json
	for a in "$ALLOC_P1" "$ALLOC_P2"; do
		if [[ $(leases_of "$(cid "$a")") == "live||${IP[$a]}" ]]; then pass "leases: $a live"; else fail "leases: $a is not (only) live on ${IP[$a]}: $(leases_of "$(cid "$a")")"; fi
	done
	nbc gc --data-dir "$P_DATA_DIR"
	expect_nothing_to_release "gc --data-dir $P_DATA_DIR"
	nbc gc --data-dir "$DATA_DIR"
	expect_nothing_to_release "gc --data-dir $DATA_DIR"
	local gone=0
	for f in "${live[@]}"; do
		[[ -f $f ]] || {
			gone=1
			fail "gc removed $f, a live attachment's"
		}
	done
	[[ $gone == 0 && ${#live[@]} -gt 0 ]] && pass "the live attachments' ${#live[@]} leases and records are all still there"
	run 5 find "$P_DATA_DIR" -type f
	# ----------------------------------------------------------------------------------

	echo 2 >"$STATE/phase"
	echo "[phase 1] finished" >>"$STATE/phase-log"
	sync
	step "rebooting the guest for real"
	echo "NBC-PHASE 1 END"
	exit 100
}

# ============================================================== phase 2 ===
phase2() {
	PHASE=2
	echo "NBC-PHASE 2 BEGIN"
	local before now a id
	before=$(cat "$STATE/boot_id")
	now=$(cat /proc/sys/kernel/random/boot_id)
	step "second boot: boot_id $now (first boot: $before)"

	step "the reboot really happened: /run is empty, /var/lib kept"
	[[ $now != "$before" ]] || fatal "boot_id did not change: this is not a new boot"
	run 5 ls -la /run
	[[ -z $(ls -A "$NETNS_DIR" 2>/dev/null) ]] || fatal "$NETNS_DIR is not empty after the reboot"
	[[ ! -e $DATA_DIR ]] || fatal "$DATA_DIR survived the reboot"
	! ip link show "$BRIDGE" >/dev/null 2>&1 || fatal "the bridge $BRIDGE survived the reboot"
	run 10 iptables -t nat -S
	! grep -q CNI <<<"$OUT" || fatal "iptables rules survived the reboot"
	run 5 ls -la "$CNI_CACHE/results" "$CTL_LEASES"
	[[ -n $(ls -A "$CNI_CACHE/results" 2>/dev/null) ]] || fatal "$CNI_CACHE/results did not survive the reboot"
	[[ -n $(lease_files "$CTL_LEASES") ]] || fatal "the control's lease did not survive the reboot"

	step "boot sweep: nomad-bridge-cni-boot.service ran before this driver (nomad.service) and released $B_NET's lease"
	local b_alloc b_ip done_at started_at
	read -r b_alloc b_ip <"$STATE/boot-sweep-ip"
	run 10 systemctl show -p ActiveState -p Result -p ExecMainExitTimestampMonotonic nomad-bridge-cni-boot.service
	if grep -qx 'ActiveState=active' <<<"$OUT" && grep -qx 'Result=success' <<<"$OUT"; then pass "the boot sweep ran and succeeded"; else fail "the boot sweep did not run or failed: $(tr '\n' ' ' <<<"$OUT")"; fi
	done_at=$(sed -n 's/^ExecMainExitTimestampMonotonic=//p' <<<"$OUT")
	started_at=$(systemctl show -p ExecMainStartTimestampMonotonic --value nomad.service)
	if [[ $done_at =~ ^[0-9]+$ && $started_at =~ ^[0-9]+$ && $done_at -gt 0 && $done_at -le $started_at ]]; then
		pass "the boot sweep ended (${done_at} µs) before nomad.service started (${started_at} µs)"
	else
		fail "the boot sweep did not end before nomad.service started ($done_at, $started_at)"
	fi
	if [[ -n $b_ip && ! -e $B_LEASES/$b_ip && ! -e $B_RECORDS/$(cid "$b_alloc")@eth0 ]]; then
		pass "$b_alloc's lease $b_ip and record were gone before this driver's first ADD"
	else
		fail "$b_alloc's lease ${b_ip:-?} or record is still in $B_DATA_DIR after the boot sweep"
	fi
	run 10 journalctl -b --no-pager -o cat -u nomad-bridge-cni-boot.service
	if grep -qF "released $B_NET $(cid "$b_alloc")/eth0 $b_ip: $EARLIER_BOOT" <<<"$OUT"; then
		pass "the journal of this boot has the boot sweep's release of $b_alloc ($b_ip: $EARLIER_BOOT)"
	else
		fail "the boot sweep's journal has no \"released $B_NET $(cid "$b_alloc")/eth0 $b_ip: $EARLIER_BOOT\" line"
	fi
	run 10 systemctl list-timers --all --no-pager 'nomad-bridge-cni-*'
	if grep -qF nomad-bridge-cni-gc.timer <<<"$OUT" && grep -qF nomad-bridge-cni-metrics.timer <<<"$OUT"; then pass "both timers are listed after the reboot"; else fail "the timers are not listed after the reboot"; fi

	# ---- GC steps (phase 2, before the restore) ---------------------------------------
	# What the persistent dataDir kept: P1's and P2's leases and records of the first
	# boot. `leases` must call them stale, `gc --dry-run` must change nothing, P1's
	# re-ADD must release its own old attachment first, and CHECK's sweep must release
	# P2 (nobody restores it: its job was stopped while the node was down).
	step "GC: what the persistent $P_DATA_DIR kept across the reboot"
	declare -A OLD_IP=()
	local p_ok=1 ida idb ip
	while read -r a ip; do OLD_IP[$a]=$ip; done <"$STATE/persist-ips"
	run 5 find "$P_DATA_DIR" -type f
	for a in "$ALLOC_P1" "$ALLOC_P2"; do
		id=$(cid "$a")
		if [[ -n ${OLD_IP[$a]:-} && $(leases_held_by "$P_LEASES" "$id") == "$P_LEASES/${OLD_IP[$a]}" && -f $(record_of "$a") ]]; then
			pass "$a's lease (${OLD_IP[$a]}) and record survived the reboot on $P_DATA_DIR"
		else
			p_ok=0
			fail "$a's lease ${OLD_IP[$a]:-?} or record is not in $P_DATA_DIR after the reboot: the GC steps prove nothing"
		fi
	done
	ida=$(cid "$ALLOC_P1") idb=$(cid "$ALLOC_P2")
	if [[ $p_ok == 1 ]]; then
		nbc leases --data-dir "$P_DATA_DIR" --json
		for a in "$ALLOC_P1" "$ALLOC_P2"; do
			if [[ $(leases_of "$(cid "$a")") == "stale|$EARLIER_BOOT|${OLD_IP[$a]}" ]]; then
				pass "leases: $a stale ($EARLIER_BOOT)"
			else
				fail "leases: $a is not stale \"$EARLIER_BOOT\": $(leases_of "$(cid "$a")")"
			fi
		done

		local before_gc after_gc
		before_gc=$(tree_state "$P_DATA_DIR")
		nbc gc --data-dir "$P_DATA_DIR" --dry-run
		for a in "$ALLOC_P1" "$ALLOC_P2"; do
			grep -qF "would release $P_NET $(cid "$a")/eth0 ${OLD_IP[$a]}: $EARLIER_BOOT" <<<"$OUT" ||
				fail "gc --dry-run does not say it would release $a (${OLD_IP[$a]}): $EARLIER_BOOT"
		done
		after_gc=$(tree_state "$P_DATA_DIR")
		if [[ $before_gc == "$after_gc" ]]; then
			pass "gc --dry-run changed nothing under $P_DATA_DIR ($(grep -c . <<<"$after_gc") entries and digests compared)"
		else
			fail "gc --dry-run changed $P_DATA_DIR: $(diff <(echo "$before_gc") <(echo "$after_gc") | grep '^[<>]' | tr '\n' ' ' | cut -c1-400)"
		fi

		step "GC: restore $ALLOC_P1 on $P_NET (netns re-created, ADD without DEL); $ALLOC_P2 is not restored"
		if p_add "$ALLOC_P1"; then
			pass "re-ADD $P_NET/$ALLOC_P1 after the reboot"
			if grep -qF "dataDir $P_DATA_DIR is not on tmpfs" <<<"$ERR"; then
				pass "the first ADD of the new boot warned again that $P_DATA_DIR is not on tmpfs"
			else
				fail "the first ADD of the new boot did not warn that $P_DATA_DIR is not on tmpfs (stderr: $(tr '\n' ' ' <<<"$ERR" | cut -c1-300))"
			fi
			if released_in_err "$ida" "${OLD_IP[$ALLOC_P1]}"; then
				pass "the re-ADD released $ALLOC_P1's old attachment first ($EARLIER_BOOT)"
			else
				fail "the re-ADD's stderr has no \"released $ida/eth0 ${OLD_IP[$ALLOC_P1]}: $EARLIER_BOOT\" line"
			fi
			if [[ $(leases_held_by "$P_LEASES" "$ida") == "$P_LEASES/${IP[$ALLOC_P1]}" ]]; then
				pass "exactly one lease for $ALLOC_P1: ${IP[$ALLOC_P1]}"
			else
				fail "leases of $ALLOC_P1 are not exactly ${IP[$ALLOC_P1]}: $(leases_held_by "$P_LEASES" "$ida" | tr '\n' ' ')"
			fi
			[[ ${IP[$ALLOC_P1]} != "${OLD_IP[$ALLOC_P2]}" ]] || fail "$ALLOC_P1 got $ALLOC_P2's address ${OLD_IP[$ALLOC_P2]} while its lease still exists"
			if ping_from "$ALLOC_P1" "${GW[$ALLOC_P1]}"; then pass "$ALLOC_P1 reaches its gateway ${GW[$ALLOC_P1]}"; else fail "$ALLOC_P1 cannot ping its gateway ${GW[$ALLOC_P1]}"; fi
		else
			p_ok=0
			fail "re-ADD $P_NET/$ALLOC_P1 after the reboot failed: $(cni_error)"
		fi
	fi
	if [[ $p_ok == 1 ]]; then
		if [[ -f $P_LEASES/${OLD_IP[$ALLOC_P2]} && -f $(record_of "$ALLOC_P2") ]]; then
			pass "$ALLOC_P2's stale lease and record are still there for CHECK's sweep"
		else
			fail "$ALLOC_P2's lease or record went before CHECK: the re-ADD of $ALLOC_P1 should release only its own"
		fi

		step "GC: CHECK $ALLOC_P1 (Nomad's restore hook) sweeps $P_NET and releases $ALLOC_P2"
		if p_cni check "$ALLOC_P1"; then pass "CHECK $ALLOC_P1"; else fail "CHECK $P_NET/$ALLOC_P1 failed: $(cni_error)"; fi
		if released_in_err "$idb" "${OLD_IP[$ALLOC_P2]}"; then
			pass "CHECK's stderr: released $ALLOC_P2 (${OLD_IP[$ALLOC_P2]}): $EARLIER_BOOT"
		else
			fail "CHECK's stderr has no \"released $idb/eth0 ${OLD_IP[$ALLOC_P2]}: $EARLIER_BOOT\" line"
		fi
		if [[ -z $(leases_held_by "$P_LEASES" "$idb") && ! -e $P_LEASES/${OLD_IP[$ALLOC_P2]} && ! -e $(record_of "$ALLOC_P2") ]]; then
			pass "$ALLOC_P2's lease ${OLD_IP[$ALLOC_P2]} and record are gone"
		else
			fail "$ALLOC_P2's lease or record is still there after CHECK: $(leases_held_by "$P_LEASES" "$idb" | tr '\n' ' ') $(ls "$(record_of "$ALLOC_P2")" 2>/dev/null)"
		fi
		if [[ $(leases_held_by "$P_LEASES" "$ida") == "$P_LEASES/${IP[$ALLOC_P1]}" && -f $(record_of "$ALLOC_P1") ]]; then
			pass "the live $ALLOC_P1 kept its lease and record"
		else
			fail "CHECK's sweep touched the live $ALLOC_P1's lease or record"
		fi
		nbc gc --data-dir "$P_DATA_DIR"
		expect_nothing_to_release "a second sweep (gc --data-dir $P_DATA_DIR)"
		run 5 find "$P_DATA_DIR" -type f
	fi
	# ----------------------------------------------------------------------------------

	step "restore the allocations as Nomad does: same netns paths, same container IDs, ADD without DEL"
	local ok_a=1 ok_b=1
	add_alloc "$ALLOC_A" "$NET" || {
		ok_a=0
		fail "re-ADD $NET/$ALLOC_A after the reboot failed: $(cni_error)"
	}
	add_alloc "$ALLOC_B" "$NET" "$PORTMAP_B" || {
		ok_b=0
		fail "re-ADD $NET/$ALLOC_B after the reboot failed: $(cni_error)"
	}
	run 5 ls -la "$LEASES"
	[[ $ok_a == 1 ]] && check_attached "$ALLOC_A"
	[[ $ok_b == 1 ]] && check_attached "$ALLOC_B" portmap
	if [[ $ok_a == 1 && $ok_b == 1 ]]; then
		if [[ $(stat -f -c %T "$DATA_DIR") == tmpfs ]]; then pass "$DATA_DIR is on tmpfs"; else fail "$DATA_DIR is not on tmpfs"; fi

		step "connectivity after the restore"
		check_connectivity "$ALLOC_A" "$ALLOC_B"
		check_port_mapping "$ALLOC_B"

		step "CHECK after the restore"
		if cni check "$NET" "$ALLOC_A"; then pass "CHECK $ALLOC_A"; else fail "CHECK $NET/$ALLOC_A failed after the restore: $(cni_error)"; fi
		if cni check "$NET" "$ALLOC_B" "$PORTMAP_B"; then pass "CHECK $ALLOC_B"; else fail "CHECK $NET/$ALLOC_B failed after the restore: $(cni_error)"; fi
	fi

	step "control: the bare bridge's re-ADD must fail the upstream way"
	if add_alloc "$ALLOC_C" "$CTL_NET"; then
		fail "the control's re-ADD succeeded: this reboot did not reproduce the bug, the test proves nothing"
	elif grep -q "duplicate allocation is not allowed" <<<"$OUT"; then
		pass "control re-ADD failed with \"duplicate allocation is not allowed\" (the bug this plugin fixes)"
	else
		fail "the control's re-ADD failed, but not with \"duplicate allocation is not allowed\": $(cni_error)"
	fi

	# ---- GC steps (phase 2, after the restore) ----------------------------------------
	if [[ $ok_a == 1 && $ok_b == 1 ]]; then
		step "GC after the restore: \`leases\` shows $NET's restored allocations live, \`gc\` keeps them"
		nbc leases --data-dir "$DATA_DIR" --network "$NET" --json
		for a in "$ALLOC_A" "$ALLOC_B"; do
			if [[ $(leases_of "$(cid "$a")") == "live||${IP[$a]}" ]]; then pass "leases: $a live"; else fail "leases: $a is not (only) live on ${IP[$a]}: $(leases_of "$(cid "$a")")"; fi
		done
		nbc gc --data-dir "$DATA_DIR" --network "$NET"
		expect_nothing_to_release "gc --data-dir $DATA_DIR --network $NET"
		for a in "$ALLOC_A" "$ALLOC_B"; do
			[[ -f $LEASES/${IP[$a]} ]] || fail "gc removed the lease of the restored $a"
		done
		if ping_from "$ALLOC_A" "${IP[$ALLOC_B]}"; then pass "$ALLOC_A still reaches $ALLOC_B after the gc"; else fail "$ALLOC_A cannot ping $ALLOC_B after the gc"; fi
	fi
	# ----------------------------------------------------------------------------------

	step "DEL everything"
	stop_tasks "$ALLOC_A" "$ALLOC_B" "$ALLOC_C"
	cni del "$NET" "$ALLOC_A" || fail "DEL $NET/$ALLOC_A failed: $(cni_error)"
	cni del "$NET" "$ALLOC_B" "$PORTMAP_B" || fail "DEL $NET/$ALLOC_B failed: $(cni_error)"
	cni del "$CTL_NET" "$ALLOC_C" || echo "    (the control's DEL failed; not part of the verdict)"
	if [[ -e $(netns_path "$ALLOC_P1") ]]; then
		p_cni del "$ALLOC_P1" || fail "DEL $P_NET/$ALLOC_P1 failed: $(cni_error)"
	fi
	for a in "$ALLOC_A" "$ALLOC_B" "$ALLOC_C" "$ALLOC_P1"; do [[ -e $(netns_path "$a") ]] && run 10 ip netns del "$a"; done

	step "nothing of ours is left: leases, records, chains, rules"
	run 5 find "$DATA_DIR" "$CNI_CACHE" -type f
	if [[ -n $(lease_files "$LEASES") ]]; then
		fail "leases left in $LEASES: $(lease_files "$LEASES" | tr '\n' ' ')"
	else
		pass "no lease in $LEASES"
	fi
	if [[ -n $(lease_files "$LEGACY_LEASES") ]]; then
		fail "leases left in $LEGACY_LEASES: $(lease_files "$LEGACY_LEASES" | tr '\n' ' ')"
	else
		pass "no lease in $LEGACY_LEASES"
	fi
	run 10 iptables -t nat -S POSTROUTING
	if masq_jumps | grep -qF "name: \"$NET\" id: "; then
		fail "ipMasq POSTROUTING jumps for $NET left: $(masq_jumps | grep -F "name: \"$NET\" id: " | tr '\n' ' ')"
	else
		pass "no POSTROUTING jump commented with $NET"
	fi
	local rules
	rules=$( (timeout 10 iptables-save; timeout 10 ip6tables-save) 2>&1)
	for a in "$ALLOC_A" "$ALLOC_B"; do
		id=$(cid "$a")
		if grep -qE -- "^:($(masq_chain "$NET" "$id")|$(dnat_chain "$NET" "$id")) " <<<"$rules"; then
			fail "chains of $a left: $(grep -E -- "^:($(masq_chain "$NET" "$id")|$(dnat_chain "$NET" "$id")) " <<<"$rules" | tr '\n' ' ')"
		else
			pass "no ipMasq or CNI-DN chain of $a"
		fi
		if grep -qF -e "$id" <<<"$rules"; then
			fail "rules mentioning $id left: $(grep -F "$id" <<<"$rules" | tr '\n' ' ')"
		else
			pass "no rule mentions $id"
		fi
		if [[ -n ${IP[$a]:-} ]] && grep -qF -e "${IP[$a]}/32" <<<"$rules"; then
			fail "rules for ${IP[$a]} ($a) left: $(grep -F "${IP[$a]}/32" <<<"$rules" | tr '\n' ' ')"
		fi
		# our records, libcni's cached results, host-local's leases: any file naming the ID
		if grep -rlF -e "$id" "$DATA_DIR" "$CNI_CACHE" >/dev/null 2>&1; then
			fail "files mentioning $id left: $(grep -rlF -e "$id" "$DATA_DIR" "$CNI_CACHE" | tr '\n' ' ')"
		else
			pass "no file under $DATA_DIR or $CNI_CACHE mentions $id"
		fi
	done
	if grep -q -- "^:CNI-DN-" <<<"$rules"; then
		fail "CNI-DN chains left: $(grep -- '^:CNI-DN-' <<<"$rules" | tr '\n' ' ')"
	fi
	# The persistent network: P1 was DELeted, P2 released by CHECK's sweep. (libcni's
	# cached result of P2 stays in $CNI_CACHE: nobody ran DEL for it, as after a real
	# node outage; that cache is libcni's, not ours.)
	run 5 find "$P_DATA_DIR" -type f
	if [[ -n $(lease_files "$P_LEASES") ]]; then
		fail "leases left in $P_LEASES: $(lease_files "$P_LEASES" | tr '\n' ' ')"
	else
		pass "no lease in $P_LEASES"
	fi
	if masq_jumps | grep -qF "name: \"$P_NET\" id: "; then
		fail "ipMasq POSTROUTING jumps for $P_NET left: $(masq_jumps | grep -F "name: \"$P_NET\" id: " | tr '\n' ' ')"
	else
		pass "no POSTROUTING jump commented with $P_NET"
	fi
	for a in "$ALLOC_P1" "$ALLOC_P2"; do
		id=$(cid "$a")
		if grep -qE -- "^:($(masq_chain "$P_NET" "$id")|$(dnat_chain "$P_NET" "$id")) " <<<"$rules" || grep -qF -e "$id" <<<"$rules"; then
			fail "chains or rules of $P_NET/$a left: $(grep -E -e "^:($(masq_chain "$P_NET" "$id")|$(dnat_chain "$P_NET" "$id")) " -e "$id" <<<"$rules" | tr '\n' ' ')"
		else
			pass "no chain or rule of $P_NET/$a"
		fi
		if grep -rlF -e "$id" "$P_DATA_DIR" >/dev/null 2>&1 || [[ -e $(record_of "$a") ]]; then
			fail "files mentioning $id left: $(grep -rlF -e "$id" "$P_DATA_DIR" | tr '\n' ' ') $(ls "$(record_of "$a")" 2>/dev/null)"
		else
			pass "no lease or record of $a under $P_DATA_DIR"
		fi
	done
	if grep -rlF -e "$(cid "$ALLOC_P1")" "$CNI_CACHE" >/dev/null 2>&1; then
		fail "files mentioning $(cid "$ALLOC_P1") left: $(grep -rlF -e "$(cid "$ALLOC_P1")" "$CNI_CACHE" | tr '\n' ' ')"
	else
		pass "no file under $CNI_CACHE mentions $ALLOC_P1 (DELeted)"
	fi

	# ---- GC steps (phase 2, after DEL) -------------------------------------------------
	step "GC after the DELs: a sweep of both dataDirs, NAT rules included, has nothing to release"
	local d
	for d in "$DATA_DIR" "$P_DATA_DIR"; do
		nbc gc --data-dir "$d" --orphan-rules
		expect_nothing_to_release "gc --data-dir $d --orphan-rules"
	done
	# ----------------------------------------------------------------------------------

	finish
}

# ================================================================= main ===
case $(cat "$STATE/phase" 2>/dev/null) in
"") phase1 ;;
2) phase2 ;;
*)
	PHASE=3
	echo "NBC-RESULT: FAIL (an unexpected third boot; phase log: $(tr '\n' ' ' <"$STATE/phase-log" 2>/dev/null))"
	exit 0
	;;
esac
