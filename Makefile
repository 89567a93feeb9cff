# Kelp developer entry points. `make demo` and `make test` work on a fresh
# machine: they create .venv, install everything (torch from the local CPU
# build first, kelp_native built from native/ with cargo), install redis-server
# and cargo with apt-get when missing, then run.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.kelp-setup-stamp
TORCH_VERSION ?= 2.13.0
PYTEST_ARGS ?=
# `make test` runs the suite on this many pytest-xdist workers (0: in this process). The tests
# mostly wait on brokers, servers and child processes (JVM starts, redis-server, subprocess CLIs),
# so one worker more than the two cores keeps both busy while another waits; each worker starts
# its own session services (Kafka, Redis, Redis Cluster, s3proxy) on its own free ports.
# --dist loadscope keeps a module's tests (and its module-scoped fixtures) on one worker.
PYTEST_WORKERS ?= 3

.PHONY: setup system-deps system-deps-test kafka-jars demo test lint fmt bench clean

NATIVE_STAMP := $(VENV)/.kelp-native-stamp

setup: system-deps $(STAMP) $(NATIVE_STAMP)

# Re-runs only when the dependency declarations change, so a second
# `make test` starts in seconds.
$(STAMP): pyproject.toml requirements/broker.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==$(TORCH_VERSION)
	$(PIP) install --quiet -e '.[dev]'
	$(PIP) install --quiet --require-hashes --no-deps -r requirements/broker.txt
	@touch $(STAMP)

# kelp_native (native/, Rust + PyO3) built from source by maturin with the machine's cargo;
# not a dependency in pyproject.toml, where pip would look for it on PyPI. An edit to the
# crate rebuilds it. After system-deps, which installs cargo when missing (also under make -j).
$(NATIVE_STAMP): $(STAMP) native/Cargo.toml native/Cargo.lock native/pyproject.toml $(wildcard native/src/*.rs) native/kelp_native.pyi | system-deps
	$(PIP) install --quiet --force-reinstall --no-deps ./native
	@touch $(NATIVE_STAMP)

system-deps:
	@bash scripts/install-system-deps.sh

# Test-only system tools (promtool, from Debian's `prometheus`): `make test` only, never `make demo`.
system-deps-test:
	@bash scripts/install-system-deps.sh --with-test-tools

demo: setup
	$(VENV)/bin/kelp demo

lint: setup
	$(VENV)/bin/ruff check .
	PY=$(PY) bash scripts/lint-imports.sh

# The Kafka tests run on Apache Kafka (KRaft); its jars are fetched by Maven into
# ~/.cache/kelp first, so no test pays for the download. system-deps-test installs
# java and mvn when apt-get can; without them this prints that the tests fall back
# to Tansu.
kafka-jars: setup system-deps-test
	$(PY) -m kelp.harness.kafka_dist
	$(PY) -m kelp.harness.s3proxy

# The chart tests install the Helm chart on a real Kubernetes control plane (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kwok's fake node) built from the Go module proxy into
# ~/.cache/kelp/k8s-<version>/ once (many minutes on a fresh machine; seconds after). Without Go,
# this prints why and those tests skip. It also links the built helm CLI as $(VENV)/bin/helm.
.PHONY: k8s-binaries helm
k8s-binaries: setup
	$(PY) -m kelp.harness.k8s_dist --link-helm $(VENV)/bin/helm

# The helm CLI the docs name (pinned, built from the Go module proxy): $(VENV)/bin/helm.
helm: setup
	$(PY) -m kelp.harness.k8s_dist --helm-only --link-helm $(VENV)/bin/helm

test: setup system-deps-test lint kafka-jars k8s-binaries
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadscope $(PYTEST_ARGS)

fmt: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Container image (scripts/image/): docker when its daemon answers, else
# podman/buildah; with those, a local debootstrap base stands in for
# python:3.11-slim when PYTHON_IMAGE is unset. Not part of `make test`: a cold
# build takes minutes. See docs/deploy.md, "Container image".
IMAGE           ?= kelp:cpu
PYTHON_IMAGE    ?=
TORCH_VARIANT   ?= cpu
TORCH_INDEX_URL ?=
TORCH_WHEELS    ?=
IMAGE_ENV = KELP_IMAGE=$(IMAGE) PYTHON_IMAGE=$(PYTHON_IMAGE) PYTHON=$(PYTHON) \
	TORCH_VERSION=$(TORCH_VERSION) TORCH_VARIANT=$(TORCH_VARIANT) \
	TORCH_INDEX_URL=$(TORCH_INDEX_URL) TORCH_WHEELS=$(TORCH_WHEELS)

.PHONY: image image-test
image:
	$(IMAGE_ENV) bash scripts/image/build.sh

image-test:
	$(IMAGE_ENV) bash scripts/image/image-test.sh

# The Helm chart through Helm's own library (helm-python-sdk, pinned in the dev extras, so `setup`
# installs it): no helm binary. `make chart VALUES=kelp-values.yaml` lints and renders it into
# build/chart/$(RELEASE)/ and checks the Kelp config the pods will read with Kelp's loader;
# `make helm-install` does that, then installs or upgrades the release through the current
# kubeconfig. VALUES may name several files, layered like `helm -f A -f B`. See docs/deploy.md.
VALUES    ?=
RELEASE   ?= kelp
NAMESPACE ?= kelp
CHART_ARGS = $(foreach file,$(VALUES),-f $(file)) --release $(RELEASE) --namespace $(NAMESPACE)
NEED_VALUES = @test -n "$(VALUES)" || { echo "make $@: set VALUES=your-values.yaml" >&2; exit 2; }

.PHONY: chart helm-install helm-uninstall
chart: setup
	$(NEED_VALUES)
	$(PY) scripts/chart.py check $(CHART_ARGS)

helm-install: setup
	$(NEED_VALUES)
	$(PY) scripts/chart.py install $(CHART_ARGS) --create-namespace --wait

helm-uninstall: setup
	$(PY) scripts/chart.py uninstall --release $(RELEASE) --namespace $(NAMESPACE) --wait

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache native/target
