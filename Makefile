# gpud — build, test and try it out. Everything runs on a machine without a GPU: NVML is the
# simulated library in tests/nvml-mock.

CARGO    ?= cargo
MOCK_DIR := target/nvml-mock
MOCK_LIB := $(MOCK_DIR)/libnvidia-ml.so.1
GPUD     := target/release/gpud
FIXTURE  ?= dgx-h100
# The one release build behind build, mock and demo: the binary, the mock library and the
# simulated kubelet together. Built apart, cargo would resolve their shared dependencies with
# different features, and each target would rebuild what the other just built.
RELEASE_BUILD := $(CARGO) build --release -p gpud -p nvml-mock --bin gpud --lib --example kubelet_sim \
	--example scrape

VERSION   = $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
IMAGE    ?= gpud:$(VERSION)
IMAGE_DIR := target/image
VENV     := target/venv-deploy
PREFIX   ?= /usr/local
DESTDIR  ?=
SYSCONFDIR ?= /etc
UNITDIR  ?= $(SYSCONFDIR)/systemd/system

.PHONY: all build mock test lint demo bench fleet e2e chaos clean-mock image image-test manifests-test \
	install uninstall install-test

all: build

## build: the release binary at target/release/gpud
build:
	$(RELEASE_BUILD)

## mock: the simulated NVML library at target/nvml-mock/libnvidia-ml.so.1
mock:
	$(RELEASE_BUILD)
	$(install_mock)

# Puts the built library in place atomically: a copy beside it, then a rename, so a process
# that has the old one loaded (a demo, a benchmark) keeps its file instead of crashing.
define install_mock
	@mkdir -p $(MOCK_DIR)
	@cp target/release/libnvidia_ml_mock.so $(MOCK_LIB).new.$$$$ && mv -f $(MOCK_LIB).new.$$$$ $(MOCK_LIB)
endef

## test: unit and integration tests, plus the Python checks of the mock (nvidia-ml-py,
## nvitop-exporter) and a grpcio client, in a virtual environment at target/py-venv (made by
## tests/python/venv.sh, never in your own Python)
test:
	@tests/python/venv.sh >/dev/null || [ $$? -eq 3 ]
	$(CARGO) test --workspace
	tests/pynvml/run.sh

## lint: formatting and clippy, warnings are errors
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## demo: gpud against a simulated node (FIXTURE=dgx-h100 by default; see tests/fixtures/nodes)
## One cargo invocation (RELEASE_BUILD) builds all it needs; a re-run with nothing changed
## builds nothing.
demo:
	$(RELEASE_BUILD)
	$(install_mock)
	@test -f tests/fixtures/nodes/$(FIXTURE).json || test -f "$(FIXTURE)" || { \
		echo "make demo: no fixture '$(FIXTURE)'; choose one of: $$(ls tests/fixtures/nodes | sed 's/\.json$$//' | tr '\n' ' ')"; \
		exit 2; }
	@echo "== gpud inventory --format table   (simulated node: $(FIXTURE))"
	@NVML_MOCK_FIXTURE=$(FIXTURE) NODE_NAME=demo-node GPUD_NVML_LIB=$(MOCK_LIB) \
		$(GPUD) inventory --format table
	@echo
	@echo "== gpud run (device plugin, labeller, exporter, health) against a simulated kubelet"
	@dir=$$(mktemp -d); touch $$dir/control; port=$$((20000 + $$$$ % 20000)); \
	NVML_MOCK_FIXTURE=$(FIXTURE) GPUD_NVML_LIB=$(MOCK_LIB) $(GPUD) inventory >$$dir/inventory.json; \
	NVML_MOCK_FIXTURE=$(FIXTURE) NVML_MOCK_CONTROL=$$dir/control GPUD_NVML_LIB=$(MOCK_LIB) GPUD_LOG=warn \
		GPUD_STATE_DIR=$$dir/state \
		$(GPUD) run --kubelet-socket $$dir/kubelet.sock --kmsg "" --health-poll-interval 200ms \
		-o $$dir/gfd --no-timestamp -a 127.0.0.1:$$port -c 500 & \
	pid=$$!; \
	target/release/examples/kubelet_sim $$dir $$dir/control; status=$$?; \
	if [ -f $$dir/gfd ]; then \
		echo; echo "== node labels (NFD features file written by the same process)"; \
		grep -E 'gpu.product|gpu.count|gpu.memory|gpud.io/gpu.health' $$dir/gfd; \
	fi; \
	gpu=$$(cat $$dir/demo-gpu 2>/dev/null); \
	if [ -n "$$gpu" ]; then \
		echo; echo "== /metrics for GPU $$gpu (the same process, port $$port)"; sleep 0.6; \
		if command -v curl >/dev/null; then \
			curl -s 127.0.0.1:$$port/metrics | grep -E '^(DCGM_FI_DEV_GPU_UTIL|gpud_xid_errors_total|gpud_gpu_health)\{gpu="'$$gpu'"'; \
		else echo "(curl not found: skipped)"; fi; \
	fi; \
	kill $$pid 2>/dev/null; wait $$pid 2>/dev/null; rm -rf $$dir; exit $$status

## bench: performance measurements (release build): health latency, device plugin (with the
## :authority rewriter), labeller, the whole daemon (start-up, idle CPU, memory), a fatal XID
## to the GPU back in service (remediation), then the
## exporter: throughput/p99 against nginx serving the same bytes, a fresh body every interval
## (CPU per scrape, p99; GPUD_BENCH_BASELINE=<older gpud> compares builds), nvitop-exporter on
## the same simulated node (req/s, p99, RSS, idle CPU), CPU per sample cycle, RSS
bench:
	$(CARGO) bench --bench health_latency
	$(CARGO) bench --bench device_plugin
	$(CARGO) bench --bench labeller
	$(CARGO) bench --bench daemon
	$(CARGO) bench --bench upgrade
	$(CARGO) bench --bench pod_usage
	$(CARGO) bench --bench remediation
	CARGO=$(CARGO) benches/exporter.sh

## fleet: what gpud costs the API server at fleet scale: N release `gpud run` processes
## (NODES, default sized to memory, at least 200), each a simulated node, against one counting
## API stand-in; steady state for DURATION (10m), a correlated XID, an API server outage and a
## rolling restart, each extrapolated to 5 000 nodes (see docs/scale.md); OUTAGE sets the
## outage apart from DURATION; not part of bench
NODES    ?=
DURATION ?=
OUTAGE   ?=
fleet:
	GPUD_FLEET_NODES=$(NODES) GPUD_FLEET_DURATION=$(DURATION) GPUD_FLEET_OUTAGE=$(OUTAGE) \
		$(CARGO) bench --bench fleet

## e2e: a real Prometheus server scrapes gpud exporter on the simulated dgx-h100 and must
## return DCGM_FI_DEV_GPU_UTIL for all 8 GPUs (needs Debian's prometheus package)
e2e: build mock
	tests/e2e/prometheus.sh $(GPUD) $(MOCK_LIB)

## chaos: the reliability suite: the release gpud run on the simulated node and kubelet through
## kubelet restarts, XID storms, lost GPUs, reload churn, scrape floods, pod-resources socket
## faults, the API server down and back, and kill -9 (a few minutes at most, loopback and unix
## sockets only); prints the table of docs/reliability.md
chaos: build mock
	GPUD_CHAOS_BIN=$(GPUD) GPUD_CHAOS_MOCK=$(MOCK_LIB) \
		$(CARGO) test --test chaos -- --ignored --nocapture --test-threads=1

clean-mock:
	rm -rf $(MOCK_DIR)

## image: the OCI image gpud:<version>, FROM scratch: the release binary, its applet links, the
## loader and exactly the libraries gpud and NVML need (no network needed)
image: build mock
	packaging/image/rootfs.sh $(GPUD) $(MOCK_LIB) $(IMAGE_DIR)/rootfs
	cp packaging/image/Dockerfile $(IMAGE_DIR)/Dockerfile
	docker build --quiet -t $(IMAGE) $(IMAGE_DIR)
	@echo "$(IMAGE): $$(du -sb --apparent-size $(IMAGE_DIR)/rootfs | cut -f1) bytes uncompressed"

## image-test: runs the image's containers with the DaemonSet's security settings against the
## simulated node (chroot on the root filesystem where no Docker engine answers)
image-test:
	@test -x $(IMAGE_DIR)/rootfs/usr/bin/gpud || { echo "run make image first"; exit 1; }
	$(RELEASE_BUILD)
	tests/image/run.sh $(IMAGE) $(IMAGE_DIR)/rootfs $(GPUD) $(MOCK_LIB) \
		target/release/examples/kubelet_sim target/release/examples/scrape

## manifests-test: renders every kustomize overlay and component combination, validates it
## against the oldest and newest supported Kubernetes, and checks every container's command
## line with gpud --check-config; validates the DRA goldens against the Kubernetes schemas and
## the CDI goldens against the CDI schema (needs kubectl and the venv .ci/run makes)
manifests-test: build
	$(VENV)/bin/python tests/manifests/check.py $(GPUD)

## install: the binary, its applet links, the systemd unit and its environment file
## (PREFIX=/usr/local, DESTDIR for staging); uninstall removes them
install:
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSCONFDIR)/default
	install -m 0755 $(GPUD) $(DESTDIR)$(PREFIX)/bin/gpud
	for applet in $$($(GPUD) --list); do ln -sf gpud $(DESTDIR)$(PREFIX)/bin/gpud-$$applet; done
	sed 's|/usr/local/bin/gpud|$(PREFIX)/bin/gpud|g' systemd/gpud.service \
		> $(DESTDIR)$(UNITDIR)/gpud.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/gpud.service
	test -e $(DESTDIR)$(SYSCONFDIR)/default/gpud || \
		install -m 0644 systemd/gpud.env $(DESTDIR)$(SYSCONFDIR)/default/gpud

uninstall:
	for applet in $$($(DESTDIR)$(PREFIX)/bin/gpud --list 2>/dev/null || $(GPUD) --list); do \
		rm -f $(DESTDIR)$(PREFIX)/bin/gpud-$$applet; done
	rm -f $(DESTDIR)$(PREFIX)/bin/gpud $(DESTDIR)$(UNITDIR)/gpud.service
	@if cmp -s systemd/gpud.env $(DESTDIR)$(SYSCONFDIR)/default/gpud; then \
		rm -f $(DESTDIR)$(SYSCONFDIR)/default/gpud; \
	elif test -e $(DESTDIR)$(SYSCONFDIR)/default/gpud; then \
		echo "kept $(DESTDIR)$(SYSCONFDIR)/default/gpud: it holds your settings"; fi

## install-test: install and uninstall into a temporary DESTDIR and check what lands where
install-test: build
	tests/install/run.sh $(GPUD)
