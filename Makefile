# nomad-bridge-cni — build, test, install, demo.
# Everything is built from the module versions pinned in go.mod.

GO        ?= go
BIN       ?= $(CURDIR)/bin
PREFIX    ?= /opt/cni/bin
DESTDIR   ?=
MODULE    := github.com/nomad-bridge-cni/nomad-bridge-cni

# Expanded only where a recipe uses them: `make clean` or `make -n` runs
# neither git nor go.
VERSION         ?= $(or $(shell bash scripts/release/release.sh --print-version 2>/dev/null | sed -n 's/^version //p'),v0.1.0)
PLUGINS_VERSION  = $(shell $(GO) list -m -f '{{.Version}}' github.com/containernetworking/plugins)

# The reference plugins and cnitool are go.mod's tool block. Nomad
# fingerprints plugins by the semver they print; module-proxy builds print
# "version unknown" unless stamped, so they are stamped the way a release is
# (cnitool does not link the variable; the linker ignores it there). The
# release packager is pinned apart (scripts/release/tools/go.mod), so that
# nothing but `make release` and `make test-release` downloads its module tree.
TOOLS           = $(shell $(GO) list tool)
PLUGIN_LDFLAGS  = -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$(PLUGINS_VERSION)
LDFLAGS         = -X $(MODULE)/pkg/skel.Version=$(VERSION)

.PHONY: all build build-crashpoints plugins crictl test test-unit test-e2e test-syskill test-storm test-podman test-containerd test-release test-prom test-reboot bench install install-as-bridge demo release clean deps-test deps-demo deps-unit deps-e2e deps-podman deps-containerd deps-release deps-prom

# The Debian packages each target needs, installed when missing (as root):
# one list, scripts/deps.sh, which .ci/run uses too.
DEPS := bash scripts/deps.sh
deps-test:
	@$(DEPS) unit e2e podman containerd prom
deps-demo deps-unit deps-e2e deps-podman deps-containerd deps-release deps-prom:
	@$(DEPS) $(@:deps-%=%)

all: build plugins

build:
	CGO_ENABLED=0 $(GO) build -buildvcs=false -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/nomad-bridge-cni ./cmd/nomad-bridge-cni

# The plugin with its crash points armed (internal/crashpoint), for the
# crash-point tests only: never installed.
build-crashpoints:
	CGO_ENABLED=0 $(GO) build -buildvcs=false -trimpath -tags crashpoints -ldflags '$(LDFLAGS)' -o $(BIN)/crashpoints/nomad-bridge-cni ./cmd/nomad-bridge-cni

plugins:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -buildvcs=false -trimpath -ldflags '$(PLUGIN_LDFLAGS)' -o $(BIN)/ $(TOOLS)

test: deps-test test-unit test-e2e test-prom test-podman test-containerd

test-unit: deps-unit
	$(GO) vet ./...
	$(GO) test -count=1 ./pkg/... ./cmd/... ./internal/... ./test/kit/... ./test/bench/cmd/nbcbench/

# The e2e tests need root, iptables and the binaries in $(BIN); the
# Prometheus one (prometheus_test.go) Debian's prometheus and node_exporter.
test-e2e: deps-e2e deps-prom build build-crashpoints plugins
	NBC_BIN_DIR=$(BIN) $(GO) test -count=1 -p 1 -v -timeout 30m -skip '^TestStorm$$' ./test/e2e/

# test/e2e/syskill_test.go at every K instead of test-e2e's sample: each
# state-changing path killed (test/syskill, built by the test) at each of
# its unlinks, renames, creates, writes, flocks, netlink sends and execs,
# counted over the runtime and everything it starts. Not part of `make
# test`: about 2600 kills, over an hour. Needs what test-e2e needs.
test-syskill: deps-e2e build plugins
	NBC_SYSKILL_ALL=1 NBC_BIN_DIR=$(BIN) $(GO) test -count=1 -p 1 -v -run '^TestSyskill$$' -timeout 4h ./test/e2e/

# The storm (test/e2e/storm_test.go): for STORM_DURATION, STORM_WORKERS
# workers churn containers on one network of Nomad's chain through go-cni
# (lifecycles, lost namespaces, Nomad's restores, runtimes SIGKILLed
# mid-ADD, detached tasks) while gc runs every second, every third one
# SIGKILLed; then the network must hold exactly the live containers' state.
# Not part of `make test`. Needs what test-e2e needs.
STORM_DURATION ?= 60s
STORM_WORKERS  ?= 6
test-storm: deps-e2e build plugins
	NBC_STORM=1 NBC_STORM_DURATION=$(STORM_DURATION) NBC_STORM_WORKERS=$(STORM_WORKERS) NBC_BIN_DIR=$(BIN) $(GO) test -count=1 -p 1 -v -run '^TestStorm$$' -timeout 30m ./test/e2e/

# Real podman (4.x, CNI backend) containers on networks that adopt the
# plugin by the one-word edit and installed as `bridge`, each against bare
# bridge, and rootless podman with a throw-away user. Needs root, podman,
# runc, busybox-static, uidmap and slirp4netns (.ci/run installs them);
# podman's bridge networks also chain tuning, built by `plugins`.
test-podman: deps-podman build plugins
	NBC_BIN_DIR=$(BIN) $(GO) test -count=1 -p 1 -v ./test/podman/

# crictl, pinned in a module of its own (test/containerd/tools/go.mod's tool
# directive): cri-tools pulls in Kubernetes, which go.mod must not.
crictl:
	@mkdir -p $(BIN)
	cd test/containerd/tools && CGO_ENABLED=0 $(GO) build -buildvcs=false -trimpath -o $(BIN)/crictl sigs.k8s.io/cri-tools/cmd/crictl

# A real containerd (Debian's package) of the test's own, driven through CRI
# by crictl, on containerd's conflist with the one-word edit and, as the
# control, without it. Needs root, containerd (with ctr), runc, ip and
# iptables (.ci/run installs them).
test-containerd: deps-containerd build plugins crictl
	NBC_BIN_DIR=$(BIN) $(GO) test -count=1 -p 1 -v -timeout 20m ./test/containerd/

# The shipped alerting rules (packaging/prometheus): promtool check rules,
# and promtool test rules over the plugin's metrics in each situation
# (test/prometheus, seconds, no root). The rules against a real Prometheus
# and node_exporter are test-e2e's TestPrometheusAlerts.
test-prom: deps-prom
	$(GO) test -count=1 -v ./test/prometheus/

# Builds the release artifacts into a temp dir and checks them, installs the
# .deb (dpkg) and the .rpm (rpm) into throw-away roots, and builds again to
# prove the bytes are the same (`go test -short ./test/release/` skips that
# second build).
test-release: deps-release
	$(GO) test -count=1 -v ./test/release/

# A real reboot of a Debian VM under qemu (TCG): allocations restored after the
# reboot, see test/reboot/run.sh. Needs root; installs qemu/debootstrap if
# missing; caches the guest image under $TMPDIR.
test-reboot: build plugins
	BIN=$(BIN) bash test/reboot/run.sh

# Benchmarks: the wrapper vs bare bridge, and the sweep vs lease count.
# Needs root (namespaces, bridges, iptables, a tmpfs); refreshes BENCHMARKS.md.
bench: build plugins
	BIN=$(BIN) GO=$(GO) bash test/bench/run.sh

install: build
	install -d $(DESTDIR)$(PREFIX)
	install -m 0755 $(BIN)/nomad-bridge-cni $(DESTDIR)$(PREFIX)/nomad-bridge-cni

# Installed under its delegate's name: as `bridge` in FRONT_PREFIX, a plugin
# directory the runtime must search before the reference plugins' (Nomad:
# cni_path = "/opt/nbc/bin:/opt/cni/bin"). Conflists keep "type": "bridge".
FRONT_PREFIX ?= /opt/nbc/bin
install-as-bridge: build
	install -d $(DESTDIR)$(FRONT_PREFIX)
	install -m 0755 $(BIN)/nomad-bridge-cni $(DESTDIR)$(FRONT_PREFIX)/bridge

# Release artifacts in dist/: static linux/amd64 and linux/arm64 tarballs,
# .debs and .rpms (written by nfpm, pinned in scripts/release/tools/go.mod), SHA256SUMS.
# Version from git; `make release VERSION=vX.Y.Z` overrides.
release:
	bash scripts/release/release.sh

demo: deps-demo build plugins
	BIN=$(BIN) bash test/demo/demo.sh

clean:
	rm -rf $(BIN)
