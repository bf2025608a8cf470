// Package release tests scripts/release/release.sh, what `make release` runs.
//
// It builds the release into temporary directories (never dist/), then checks
// what a user gets, against one list of what each artifact installs
// (shipped_test.go): SHA256SUMS verifies; each tarball, rooted at /, holds
// exactly those files (nothing but the binary in /opt/cni/bin), owned by 0:0,
// with the right modes and contents; the amd64 binary runs and prints the
// stamped version and its CNI VERSION JSON; the arm64 binary is a static
// AArch64 ELF stamped with the same version (read, not run); each .deb has the
// expected control fields, its conffile, the maintainer scripts of
// packaging/deb, a valid DEP-5 copyright and exactly the expected files; the
// amd64 .deb, unpacked with `dpkg -x` and installed with `dpkg --root` into a
// throw-away root (its maintainer scripts run there, chrootless with
// DPKG_ROOT), gives a working /opt/cni/bin/nomad-bridge-cni, units that pass
// `systemd-analyze verify` and come out enabled, and purging it leaves nothing
// behind; each .rpm passes `rpm --checksig`, has the expected name, version,
// release, arch, license and description, the scriptlets of packaging/rpm, no
// dependency but rpmlib's, and exactly the expected files (modes, owners,
// dates, %doc, %license and %config flags, digests); the amd64 .rpm, installed
// with `rpm --root` into a throw-away root, verifies, runs, its units pass
// `systemd-analyze verify`, and erasing it leaves only the parent directories
// it does not own; rpm sorts the versions in release order, as dpkg does; and
// a second build of the same commit is byte-for-byte identical.
//
// It needs bash, go, git, GNU tar, gzip, sha256sum, dpkg (dpkg-deb,
// dpkg-query), deb-systemd-helper (init-system-helpers), systemd-analyze
// (systemd) and rpm (Debian's rpm package); root only for the `rpm --root`
// install. Without them it skips, saying why; with CI set in the environment
// a missing prerequisite is a failure instead. Run it with
//
//	go test -count=1 -v ./test/release/
package release
