#!/usr/bin/env bash
# scripts/release/release.sh: build the release artifacts (what `make release`
# runs). Users install them without Go.
#
#   dist/nomad-bridge-cni-linux-amd64-<version>.tgz   rooted at /, to extract with tar -C /
#   dist/nomad-bridge-cni-linux-arm64-<version>.tgz   (as containerd's cri-containerd-cni
#                                                      tarballs): opt/cni/bin/nomad-bridge-cni,
#                                                      usr/lib/systemd/system/ (the units),
#                                                      usr/share/doc/nomad-bridge-cni/ (README.md,
#                                                      SECURITY.md, LICENSE, THIRD_PARTY_LICENSES:
#                                                      the Go standard library's and every linked
#                                                      module's, from the module cache; docs/,
#                                                      examples/ (the conflists), and the units'
#                                                      options file, nomad-bridge-cni.default, to
#                                                      copy to /etc/default);
#                                                      usr/share/nomad-bridge-cni/prometheus/ (the
#                                                      alerting rules); nothing lands in
#                                                      /opt/cni/bin but the binary
#   dist/nomad-bridge-cni_<debversion>_amd64.deb      the binary, the units in
#   dist/nomad-bridge-cni_<debversion>_arm64.deb      /usr/lib/systemd/system, the conffile
#                                                      /etc/default/nomad-bridge-cni, the docs in
#                                                      /usr/share/doc/nomad-bridge-cni/ (with a
#                                                      DEP-5 copyright); postinst, prerm and postrm
#                                                      enable, start, stop and forget the units as
#                                                      dh_installsystemd does (packaging/deb)
#   dist/nomad-bridge-cni-<debversion>-1.x86_64.rpm   the same, with /etc/sysconfig/nomad-bridge-cni,
#   dist/nomad-bridge-cni-<debversion>-1.aarch64.rpm  a systemd preset enabling the units, LICENSE as
#                                                      %license in /usr/share/licenses/nomad-bridge-cni/,
#                                                      and %post, %preun, %postun as the %systemd_*
#                                                      macros (packaging/rpm)
#   dist/SHA256SUMS                                    sha256sum format, all of the above
#
# The .deb and .rpm packages are written by nfpm (github.com/goreleaser/nfpm/v2,
# pinned in scripts/release/tools/go.mod) from one generated
# config. The tarballs are written with GNU tar: nfpm writes packages only, no
# plain tarballs.
#
# The binaries are static (CGO_ENABLED=0, checked: no PT_INTERP, no PT_DYNAMIC,
# no DT_NEEDED), built with -trimpath and the version stamped in pkg/skel.Version.
# Archive and package entries are owned by 0:0 (root), and dated at the commit
# time (nfpm's mtime, the rpm's build time); the tarballs' entries are sorted;
# the rpm names a fixed build host. So two runs on the same commit with the same
# toolchain give the same bytes.
#
# Environment:
#   VERSION            vX.Y.Z[-pre][+meta]; default: from git (see derive_version)
#   DIST               output directory (default: <repo>/dist)
#   SOURCE_DATE_EPOCH  timestamp of every entry (default: the commit time of HEAD)
#   DEB_MAINTAINER     the packages' maintainer (.deb Maintainer, .rpm Packager)
#   GO                 the go command (default: go)
#
# Needs: bash, go (and the module cache or the Go module proxy, for nfpm), git
# (unless VERSION and SOURCE_DATE_EPOCH are set), GNU tar, gzip, sha256sum.
# Nothing else; installs nothing. dpkg-deb and rpm, when present, only list
# what the packages hold.
#
#   scripts/release/release.sh                  build everything into $DIST
#   scripts/release/release.sh --print-version  print "version <v>" and "deb-version <d>"
set -euo pipefail
umask 022
export LC_ALL=C

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
NAME=nomad-bridge-cni
MODULE=github.com/nomad-bridge-cni/nomad-bridge-cni
HOMEPAGE=https://github.com/nomad-bridge-cni/nomad-bridge-cni
ARCHES=(amd64 arm64)
GO=${GO:-go}
DIST=${DIST:-$ROOT/dist}
DEB_MAINTAINER=${DEB_MAINTAINER:-nomad-bridge-cni maintainers <$HOMEPAGE/issues>}

die() {
	printf 'release: %s\n' "$*" >&2
	exit 1
}
step() { printf '==> %s\n' "$*"; }
git_() { git -C "$ROOT" "$@"; }

# derive_version prints the version to stamp into the binary.
#   VERSION set                 -> VERSION as given
#   HEAD is tag vX.Y.Z          -> vX.Y.Z
#   N commits after vX.Y.Z      -> vX.Y.Z-N-g<sha>       (git describe, like `make build`)
#   no v* tag at all            -> v0.1.0-git<N>.g<sha>  (N = commits in HEAD)
#   tree differs from HEAD      -> ... with -dirty appended (see tree_dirty)
derive_version() {
	if [[ -n ${VERSION:-} ]]; then
		printf '%s\n' "$VERSION"
		return
	fi
	command -v git >/dev/null 2>&1 || die "git not found: set VERSION=vX.Y.Z and SOURCE_DATE_EPOCH"
	git_ rev-parse --git-dir >/dev/null 2>&1 || die "$ROOT is not a git checkout git can read: set VERSION=vX.Y.Z and SOURCE_DATE_EPOCH"
	local v dirty=''
	tree_dirty && dirty=-dirty
	if v=$(git_ describe --tags --match 'v[0-9]*' 2>/dev/null); then
		printf '%s%s\n' "$v" "$dirty"
		return
	fi
	printf 'v0.1.0-git%s.g%s%s\n' "$(git_ rev-list --count HEAD)" "$(git_ rev-parse --short HEAD)" "$dirty"
}

# tree_dirty: a tracked file is modified (anywhere, as `git describe --dirty`),
# or an untracked file sits among the release's inputs, where the build or the
# archives would pick it up without HEAD knowing.
tree_dirty() {
	[[ -n $(git_ status --porcelain --untracked-files=no) ]] ||
		[[ -n $(git_ status --porcelain --untracked-files=all -- \
			go.mod go.sum cmd pkg internal README.md SECURITY.md LICENSE scripts/release packaging docs conflist) ]]
}

# deb_version maps a binary version to a Debian version (no revision: a
# native-style version, so it must not contain '-'). Order is preserved:
#   v1.2.3                 -> 1.2.3
#   v1.2.3-4-gabc1234      -> 1.2.3+git4.abc1234        (after the tag: sorts after 1.2.3)
#   v1.2.3-rc.1            -> 1.2.3~rc.1                (pre-release: sorts before 1.2.3)
#   v1.2.3-rc.1-4-gabc1234 -> 1.2.3~rc.1+git4.abc1234
#   v0.1.0-git18.gabc1234  -> 0.1.0~git18.abc1234       (no tag yet: before the first 0.1.0)
#   ...-dirty              -> ...+dirty, or ....dirty when there is a '+' already
#   v1.2.3+meta            -> 1.2.3+meta
# The .rpm's Version is the same string, with Release 1: rpm (>= 4.10) sorts
# '~' before anything and treats '+' and '.' as separators, so the order is
# the same there.
deb_version() {
	local v=$1 core rest meta='' pre='' post='' out
	[[ $v =~ ^v([0-9]+\.[0-9]+\.[0-9]+)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$ ]] ||
		die "version '$v' is not vMAJOR.MINOR.PATCH[-pre-release][+metadata] (letters, digits, '.', '-')"
	core=${BASH_REMATCH[1]}
	rest=${BASH_REMATCH[2]#-}
	meta=${BASH_REMATCH[3]#+}
	local dirty=
	if [[ $rest == dirty || $rest == *-dirty ]]; then
		dirty=1
		rest=${rest%dirty}
		rest=${rest%-}
	fi
	if [[ $rest =~ ^(.+-)?([0-9]+)-g([0-9a-f]+)$ ]]; then
		pre=${BASH_REMATCH[1]%-}
		post=git${BASH_REMATCH[2]}.${BASH_REMATCH[3]}
	elif [[ $rest =~ ^git([0-9]+)\.g([0-9a-f]+)$ ]]; then
		pre=git${BASH_REMATCH[1]}.${BASH_REMATCH[2]}
	else
		pre=$rest
	fi
	out=$core
	[[ -z $pre ]] || out+="~${pre//-/.}"
	[[ -z $post ]] || out+="+$post"
	if [[ -n $meta ]]; then
		[[ $out == *+* ]] && out+=".${meta//-/.}" || out+="+${meta//-/.}"
	fi
	if [[ -n $dirty ]]; then
		[[ $out == *+* ]] && out+=".dirty" || out+="+dirty"
	fi
	[[ $out =~ ^[0-9][0-9A-Za-z.+~]*$ ]] || die "internal: Debian version '$out' (from '$v') is not valid"
	printf '%s\n' "$out"
}

source_date_epoch() {
	if [[ -n ${SOURCE_DATE_EPOCH:-} ]]; then
		[[ $SOURCE_DATE_EPOCH =~ ^[0-9]+$ ]] || die "SOURCE_DATE_EPOCH='$SOURCE_DATE_EPOCH' is not a number of seconds"
		printf '%s\n' "$SOURCE_DATE_EPOCH"
		return
	fi
	git_ log -1 --format=%ct HEAD 2>/dev/null || die "cannot read the commit time of HEAD: set SOURCE_DATE_EPOCH"
}

# ------------------------------------------------------------------ args ---
case ${1:-} in
'') ;;
--print-version)
	v=$(derive_version)
	d=$(deb_version "$v")
	printf 'version %s\ndeb-version %s\n' "$v" "$d"
	exit 0
	;;
-h | --help)
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
	exit 0
	;;
*) die "unknown argument '$1' (try --help)" ;;
esac

# ----------------------------------------------------------------- tools ---
for cmd in "$GO" tar gzip sha256sum; do
	command -v "$cmd" >/dev/null 2>&1 || die "'$cmd' not found (needs: go, GNU tar, gzip, coreutils)"
done
tar --version 2>/dev/null | head -n1 | grep -q 'GNU tar' || die "tar is not GNU tar (needed for --sort=name, --owner, --mtime)"

# nfpm expands $VAR in the maintainer field: a '$' would be replaced.
[[ $DEB_MAINTAINER =~ ^[^[:cntrl:]$]+$ ]] || die "DEB_MAINTAINER must be one line of text without '$'"

V=$(derive_version)
DEBV=$(deb_version "$V")
EPOCH=$(source_date_epoch)
export SOURCE_DATE_EPOCH=$EPOCH # also set as nfpm's mtime in its config

step "$NAME $V (Debian $DEBV), timestamp $EPOCH ($(date -u -d "@$EPOCH" +%Y-%m-%dT%H:%M:%SZ))"
if command -v git >/dev/null 2>&1 && git_ rev-parse --git-dir >/dev/null 2>&1 && tree_dirty; then
	printf '    WARNING: the tree differs from its commit %s (modified files, or untracked ones among the inputs)\n' "$(git_ rev-parse --short HEAD)"
fi
printf '    %s\n    output: %s\n' "$("$GO" version)" "$DIST"

DOCS=(README.md SECURITY.md)
if [[ -f $ROOT/LICENSE ]]; then
	DOCS=(LICENSE "${DOCS[@]}")
else
	printf '    WARNING: no LICENSE file in %s: the release carries no license\n' "$ROOT"
fi
for f in "${DOCS[@]}"; do
	[[ -f $ROOT/$f ]] || die "$ROOT/$f is missing"
done
# Prometheus's alerting rules, for rule_files: not docs (a Prometheus reads
# them where they are), so beside the docs in /usr/share/<name>/.
RULES=packaging/prometheus/$NAME.rules.yml
PROMDIR=/usr/share/$NAME/prometheus
[[ -f $ROOT/$RULES ]] || die "$ROOT/$RULES is missing"
# Shipped under /usr/share/doc/<name>/: the guides (docs/*.md) and the example
# conflists (conflist/*), and the systemd units with their options file.
mapfile -t GUIDES < <(cd "$ROOT" && find docs -maxdepth 1 -type f -name '*.md' | sort)
mapfile -t EXAMPLES < <(cd "$ROOT" && find conflist -maxdepth 1 -type f \( -name '*.conflist' -o -name '*.json' -o -name '*.conf' \) | sort)
mapfile -t UNITS < <(cd "$ROOT/packaging/systemd" && find . -maxdepth 1 -type f \( -name '*.service' -o -name '*.timer' \) -printf '%f\n' | sort)
[[ ${#GUIDES[@]} -gt 0 && ${#EXAMPLES[@]} -gt 0 && ${#UNITS[@]} -gt 0 ]] || die "docs/*.md, conflist/* or packaging/systemd/* missing"
for f in packaging/nomad-bridge-cni.default packaging/nomad-bridge-cni.preset packaging/deb/postinst packaging/deb/prerm \
	packaging/deb/postrm packaging/rpm/post.sh packaging/rpm/preun.sh packaging/rpm/postun.sh; do
	[[ -f $ROOT/$f ]] || die "$ROOT/$f is missing"
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/$NAME-release.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir "$WORK/out"

# ----------------------------------------------------------------- build ---
# GOFLAGS is replaced, not inherited: a -buildmode=pie or -race in the caller's
# environment must not change the release. GOAMD64/GOARM64 are the baselines,
# so the binaries run on any x86-64 / ARMv8.0 CPU whatever the builder's env.
cd "$ROOT"
for arch in "${ARCHES[@]}"; do
	step "go build linux/$arch"
	mkdir -p "$WORK/bin/$arch"
	env CGO_ENABLED=0 GOOS=linux GOARCH="$arch" GOAMD64=v1 GOARM64=v8.0 GOFLAGS=-mod=readonly \
		"$GO" build -buildvcs=false -trimpath \
		-ldflags "-X $MODULE/pkg/skel.Version=$V" \
		-o "$WORK/bin/$arch/$NAME" ./cmd/nomad-bridge-cni
done

step "check: static ELF for the right machine, stamped $V"
checks=()
for arch in "${ARCHES[@]}"; do checks+=("$arch=$WORK/bin/$arch/$NAME"); done
env -u GOOS -u GOARCH GOFLAGS=-mod=readonly \
	"$GO" run "$ROOT/scripts/release/elfcheck.go" -module "$MODULE" -version "$V" "${checks[@]}"

# Modules linked into the binary (both arches link the same set), for the
# copyright file and the third-party licenses.
mapfile -t LINKED_MODULES < <(env GOOS=linux GOARCH=amd64 GOFLAGS=-mod=readonly \
	"$GO" list -deps -f '{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{end}}{{end}}' ./cmd/nomad-bridge-cni | sort -u)

# write_third_party_licenses writes the license files of the Go standard
# library and of every linked module, from the module cache: what a binary
# that links them must ship. A module without one stops the release.
write_third_party_licenses() { # $1: destination
	{
		printf 'Licenses of the code statically linked into %s %s:\n' "$NAME" "$V"
		printf 'the Go standard library and the Go modules below, each under its own license.\n'
		license_files "Go standard library $("$GO" env GOVERSION)" "$("$GO" env GOROOT)"
		local m
		for m in "${LINKED_MODULES[@]}"; do
			license_files "$m" "$(GOFLAGS=-mod=readonly "$GO" list -m -f '{{.Dir}}' "${m% *}")"
		done
	} >"$1"
}

license_files() { # $1: what, $2: its source directory
	local files f
	mapfile -t files < <(find "$2" -maxdepth 1 -type f \( -iname 'LICEN[CS]E*' -o -iname 'COPYING*' -o -iname 'NOTICE*' \) -printf '%f\n' | sort)
	[[ ${#files[@]} -gt 0 ]] || die "no license file in $2 ($1)"
	for f in "${files[@]}"; do
		printf '\n==== %s: %s ====\n\n' "$1" "$f"
		cat "$2/$f"
	done
}

write_third_party_licenses "$WORK/THIRD_PARTY_LICENSES"

# --------------------------------------------------------------- tarballs ---
# Rooted at /: nothing but the binary lands in /opt/cni/bin (the reference
# plugins' tarball has its own README.md and LICENSE there), and the options
# file is an example, never extracted over /etc/default's.
for arch in "${ARCHES[@]}"; do
	tgz=$NAME-linux-$arch-$V.tgz
	step "$tgz"
	st=$WORK/tar-$arch
	doc=$st/usr/share/doc/$NAME
	mkdir -m 0755 "$st"
	install -D -m 0755 "$WORK/bin/$arch/$NAME" "$st/opt/cni/bin/$NAME"
	for f in "${DOCS[@]}"; do install -D -m 0644 "$ROOT/$f" "$doc/$f"; done
	install -m 0644 "$WORK/THIRD_PARTY_LICENSES" "$doc/THIRD_PARTY_LICENSES"
	for f in "${GUIDES[@]}"; do install -D -m 0644 "$ROOT/$f" "$doc/docs/${f#docs/}"; done
	for f in "${EXAMPLES[@]}"; do install -D -m 0644 "$ROOT/$f" "$doc/examples/${f#conflist/}"; done
	install -m 0644 "$ROOT/packaging/nomad-bridge-cni.default" "$doc/nomad-bridge-cni.default"
	for f in "${UNITS[@]}"; do install -D -m 0644 "$ROOT/packaging/systemd/$f" "$st/usr/lib/systemd/system/$f"; done
	install -D -m 0644 "$ROOT/$RULES" "$st$PROMDIR/${RULES##*/}"
	find "$st" -type d -exec chmod 0755 {} +
	tar --format=gnu --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$EPOCH" \
		-C "$st" -cf - . | gzip -9n >"$WORK/out/$tgz"
	tar -tvzf "$WORK/out/$tgz" | sed 's/^/    /'
done

# ------------------------------------------------------ .deb and .rpm ---
# The Debian copyright file: the package's license, and what the binary links.
write_copyright() { # $1: destination
	{
		printf 'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n'
		printf 'Upstream-Name: %s\nSource: %s\n' "$NAME" "$HOMEPAGE"
		printf 'Comment: The binary statically links the Go standard library and these Go\n'
		printf ' modules, each under its own license (their texts are in\n'
		printf ' /usr/share/doc/%s/THIRD_PARTY_LICENSES):\n' "$NAME"
		for m in "${LINKED_MODULES[@]}"; do printf ' %s\n' "$m"; done
		if [[ -f $ROOT/LICENSE ]]; then
			printf '\nFiles: *\nCopyright: the %s authors\nLicense: %s\n' "$NAME" "$LICENSE_ID"
			printf '\nLicense: %s\n' "$LICENSE_ID"
			sed 's/^[[:space:]]*$/./; s/^/ /' "$ROOT/LICENSE"
		else
			printf '\nFiles: *\nCopyright: the %s authors\nLicense: NOASSERTION\n' "$NAME"
			printf ' The source tree of this release has no LICENSE file: no license\n'
			printf ' has been declared for %s itself.\n' "$NAME"
		fi
	} >"$1"
}

# The rpm License tag names the license of LICENSE: checked, not assumed.
license_id() {
	if [[ ! -f $ROOT/LICENSE ]]; then
		printf 'NOASSERTION\n'
	elif head -n 3 "$ROOT/LICENSE" | tr -s ' ' | grep -q 'Apache License' &&
		head -n 3 "$ROOT/LICENSE" | grep -q 'Version 2\.0'; then
		printf 'Apache-2.0\n'
	else
		die "LICENSE is not the Apache License 2.0: set the SPDX id in license_id"
	fi
}

yaml_quote() { # $1 as a YAML double-quoted scalar (no control characters)
	local s=${1//\\/\\\\}
	printf '"%s"' "${s//\"/\\\"}"
}

# nfpm_content emits one entry of nfpm's contents list.
nfpm_content() { # $1: source, $2: destination, $3: mode, $4: packager or '', $5: rpm type or ''
	printf '  - src: %s\n    dst: %s\n    file_info: {mode: 0%s}\n' "$(yaml_quote "$1")" "$(yaml_quote "$2")" "$3"
	[[ -z $4 ]] || printf '    packager: %s\n' "$4"
	[[ -z $5 ]] || printf '    type: %s\n' "$5"
}

# write_nfpm_config writes the nfpm config of one package. The .deb keeps
# Debian's layout (LICENSE in copyright, /etc/default); the .rpm marks its
# docs %doc and puts the license texts in /usr/share/licenses/<name>/
# (%license), as rpmbuild does, reads /etc/sysconfig, ships a preset that
# enables the units, and owns its directories.
write_nfpm_config() { # $1: arch, $2: packager (deb or rpm), $3: destination
	local arch=$1 pkg=$2 doc=/usr/share/doc/$NAME lic=/usr/share/licenses/$NAME f doctype=''
	local units=/usr/lib/systemd/system plugins_where options scripts
	if [[ $pkg == deb ]]; then
		options=/etc/default/$NAME scripts=$ROOT/packaging/deb
		plugins_where="Debian's containernetworking-plugins package installs them to
  /usr/lib/cni, which runtimes do not search by default: add /usr/lib/cni to
  the runtime's CNI plugin path, or put the upstream cni-plugins release in
  /opt/cni/bin."
	else
		options=/etc/sysconfig/$NAME scripts=$ROOT/packaging/rpm doctype=doc
		plugins_where="The containernetworking-plugins package of Fedora and RHEL
  installs them to /usr/libexec/cni, which Nomad and containerd do not search
  by default: add it to the runtime's CNI plugin path, or put the upstream
  cni-plugins release in /opt/cni/bin."
	fi
	{
		cat <<EOF
# Generated by scripts/release/release.sh for linux/$arch ($pkg).
name: $NAME
arch: $arch
platform: linux
version: $(yaml_quote "$DEBV")
version_schema: none
mtime: "$(date -u -d "@$EPOCH" +%Y-%m-%dT%H:%M:%SZ)"
maintainer: $(yaml_quote "$DEB_MAINTAINER")
homepage: $HOMEPAGE
license: $LICENSE_ID
section: net
priority: optional
recommends:
  - containernetworking-plugins
description: |-
  CNI plugin: bridge with host-local leases on tmpfs
  nomad-bridge-cni sits in front of the reference CNI "bridge" plugin and keeps
  host-local's IP leases on tmpfs (/var/run/cni by default), so a container
  restored after a reboot gets its address back instead of failing with
  "duplicate allocation". Adopt it by replacing "type": "bridge" with
  "type": "nomad-bridge-cni" in a conflist.

  The plugin is installed to /opt/cni/bin, the CNI bin directory of Nomad,
  containerd, CRI-O and nerdctl. It calls the reference "bridge" and
  "host-local" plugins, looked up in the runtime's CNI_PATH.
  $plugins_where

  The package enables three systemd units: a timer that releases the leases
  and NAT rules of dead containers every 5 minutes, a timer that writes
  metrics for node_exporter's textfile collector every minute (skipped until
  its directory exists), and a sweep at boot, before the container runtimes
  start. Their options are in $options.
  Installing, upgrading or removing the package touches no running container
  and no network configuration.
deb:
  # xz: dpkg on Debian < 12 cannot read zstd, Ubuntu's dpkg defaults to it.
  compression: xz
rpm:
  summary: "CNI plugin: bridge with host-local leases on tmpfs"
  compression: xz
  # The default is this machine's hostname.
  buildhost: reproducible
EOF
		if [[ $pkg == deb ]]; then
			printf 'scripts:\n  postinstall: %s\n  preremove: %s\n  postremove: %s\n' \
				"$(yaml_quote "$scripts/postinst")" "$(yaml_quote "$scripts/prerm")" "$(yaml_quote "$scripts/postrm")"
		else
			printf 'scripts:\n  postinstall: %s\n  preremove: %s\n  postremove: %s\n' \
				"$(yaml_quote "$scripts/post.sh")" "$(yaml_quote "$scripts/preun.sh")" "$(yaml_quote "$scripts/postun.sh")"
		fi
		printf 'contents:\n'
		nfpm_content "$WORK/bin/$arch/$NAME" "/opt/cni/bin/$NAME" 755 '' ''
		for f in "${UNITS[@]}"; do nfpm_content "$ROOT/packaging/systemd/$f" "$units/$f" 644 '' ''; done
		nfpm_content "$ROOT/packaging/nomad-bridge-cni.default" "$options" 644 '' 'config|noreplace'
		nfpm_content "$ROOT/$RULES" "$PROMDIR/${RULES##*/}" 644 '' ''
		for f in README.md SECURITY.md; do nfpm_content "$ROOT/$f" "$doc/$f" 644 '' "$doctype"; done
		for f in "${GUIDES[@]}"; do nfpm_content "$ROOT/$f" "$doc/docs/${f#docs/}" 644 '' "$doctype"; done
		for f in "${EXAMPLES[@]}"; do nfpm_content "$ROOT/$f" "$doc/examples/${f#conflist/}" 644 '' "$doctype"; done
		if [[ $pkg == deb ]]; then
			nfpm_content "$WORK/THIRD_PARTY_LICENSES" "$doc/THIRD_PARTY_LICENSES" 644 '' ''
			nfpm_content "$WORK/copyright" "$doc/copyright" 644 '' ''
		else
			nfpm_content "$ROOT/packaging/nomad-bridge-cni.preset" "/usr/lib/systemd/system-preset/80-$NAME.preset" 644 '' ''
			nfpm_content "$WORK/THIRD_PARTY_LICENSES" "$lic/THIRD_PARTY_LICENSES" 644 '' license
			[[ ! -f $ROOT/LICENSE ]] || nfpm_content "$ROOT/LICENSE" "$lic/LICENSE" 644 '' license
			for f in "$doc" "$doc/docs" "$doc/examples" "$lic" "${PROMDIR%/*}" "$PROMDIR"; do
				printf '  - dst: %s\n    type: dir\n    file_info: {mode: 0755}\n' "$f"
			done
		fi
	} >"$3"
}

# nfpm runs for the build machine (not GOOS/GOARCH), at the version
# scripts/release/tools/go.mod pins (a module of its own: see there).
TOOLS=$ROOT/scripts/release/tools
env -u GOOS -u GOARCH GOFLAGS=-mod=readonly "$GO" build -C "$TOOLS" -o "$WORK/nfpm" github.com/goreleaser/nfpm/v2/cmd/nfpm
nfpm() { "$WORK/nfpm" "$@"; }

LICENSE_ID=$(license_id)
write_copyright "$WORK/copyright"
step "nfpm $(GOFLAGS=-mod=readonly "$GO" -C "$TOOLS" list -m -f '{{.Version}}' github.com/goreleaser/nfpm/v2)"
declare -A RPM_ARCH=([amd64]=x86_64 [arm64]=aarch64)
for arch in "${ARCHES[@]}"; do
	deb=${NAME}_${DEBV}_$arch.deb
	rpm=$NAME-$DEBV-1.${RPM_ARCH[$arch]}.rpm
	for pkg in "deb:$deb" "rpm:$rpm"; do
		step "${pkg#*:}"
		write_nfpm_config "$arch" "${pkg%%:*}" "$WORK/nfpm-$arch-${pkg%%:*}.yaml"
		if ! nfpm package --config "$WORK/nfpm-$arch-${pkg%%:*}.yaml" --packager "${pkg%%:*}" \
			--target "$WORK/out/${pkg#*:}" >"$WORK/nfpm.log" 2>&1; then
			cat "$WORK/nfpm.log" >&2
			die "nfpm failed for ${pkg#*:}"
		fi
	done
	# Listed for the log when the tools are at hand; test/release checks them.
	if command -v dpkg-deb >/dev/null 2>&1; then
		dpkg-deb --contents "$WORK/out/$deb" | sed 's/^/    /'
	fi
	if command -v rpm >/dev/null 2>&1; then
		rpm -qlvp "$WORK/out/$rpm" 2>/dev/null | sed 's/^/    /'
	fi
done

# ----------------------------------------------------------- SHA256SUMS ---
step "SHA256SUMS"
mapfile -t artifacts < <(cd "$WORK/out" && find . -maxdepth 1 -type f -printf '%f\n' | sort)
(cd "$WORK/out" && sha256sum -- "${artifacts[@]}" >"$WORK/SHA256SUMS")
mv "$WORK/SHA256SUMS" "$WORK/out/SHA256SUMS"

mkdir -p "$DIST"
rm -f "$DIST/$NAME"-linux-*.tgz "$DIST/${NAME}"_*.deb "$DIST/$NAME"-*.rpm "$DIST/SHA256SUMS"
mv "$WORK/out"/* "$DIST/"

step "verify: sha256sum -c (in $DIST)"
(cd "$DIST" && sha256sum -c SHA256SUMS) | sed 's/^/    /'
(cd "$DIST" && ls -l -- "${artifacts[@]}" SHA256SUMS) | sed 's/^/    /'
step "done: $NAME $V"
