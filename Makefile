# colad: `make run` shows the daemon working on a sandbox; `make test` runs every test.
# Both start with `make setup`, which is idempotent and leaves colad installed in ./.venv.

PYTHON ?= python3
VENV   := .venv
PROTOC_VENV := .venv-protoc
# The stub generator is pinned: stubs from grpcio-tools 1.63+ fail on Debian
# bookworm's grpcio 1.51.1 (see docs/DEVELOPING.md, "gRPC stubs").
GRPCIO_TOOLS := grpcio-tools==1.62.3
# cel-python: the tests evaluate the CEL of the shipped admission policy (tests/unit/packaging/test_dra_component.py).
DEV_TOOLS := pytest ruff mypy kubernetes-validate==1.37.0 pyyaml jsonschema cel-python==0.5.0
# Building the .deb (dh + pybuild), linting it, and the tests that verify the unit (systemd-analyze, man)
# and boot the installed package in a fresh bookworm root (debootstrap, systemd-nspawn).
DEB_PACKAGES := debhelper dh-python pybuild-plugin-pyproject python3-all python3-setuptools python3-wheel \
	dpkg-dev fakeroot lintian debootstrap systemd-container python3-pytest systemd man-db
# Building and running the container image (make image, tests/e2e/test_image.py): rootful podman with runc
# (packaging/kubernetes/containers.conf says why not crun), buildah as the fallback builder.
IMAGE_PACKAGES := podman buildah runc
# Debian packages the tests use: bookworm's own runtime (the .deb's dependencies).
APT_PACKAGES := python3 python3-grpcio python3-protobuf python3-pyinotify python3-prometheus-client prometheus \
	supervisor python3-venv $(DEB_PACKAGES) $(IMAGE_PACKAGES)
# `kubectl kustomize packaging/kubernetes`: Debian's kubernetes-client, unless a kubectl is already installed
# (the upstream kubectl package conflicts with it over /usr/bin/kubectl).
KUBECTL_PACKAGE := $(if $(shell command -v kubectl 2>/dev/null),,kubernetes-client)

.PHONY: setup deps run test lint bench soak stubs deb image image-base clean

setup: deps $(VENV)/.installed $(PROTOC_VENV)/.installed

# Install missing Debian packages only (no network when everything is there).
deps:
	@missing=$$(for p in $(APT_PACKAGES) $(KUBECTL_PACKAGE); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:" $$missing; \
		apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null; \
	fi

# Makefile too: a tool added to DEV_TOOLS reaches an existing .venv at the next `make setup`.
$(VENV)/.installed: setup.cfg pyproject.toml Makefile
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -e . $(DEV_TOOLS)
	touch $@

$(PROTOC_VENV)/.installed:
	test -x $(PROTOC_VENV)/bin/python || $(PYTHON) -m venv $(PROTOC_VENV)
	$(PROTOC_VENV)/bin/pip install -q --disable-pip-version-check $(GRPCIO_TOOLS)
	touch $@

run: setup
	scripts/demo.sh

test: setup
	$(VENV)/bin/python -m pytest -q -ra tests

# colad against a single-process plugin through the same harness: figures, ratios and one PASS/FAIL line
# per budget (docs/PERFORMANCE.md). A report, not a test: it exits 0 whatever the verdicts. py-spy, when it
# can be installed, names the Python threads that wake while idle.
bench: setup
	@test -x $(VENV)/bin/py-spy || $(VENV)/bin/pip install -q --disable-pip-version-check py-spy \
		|| echo "bench: py-spy not installed; idle threads are named by comm only"
	$(VENV)/bin/python -m bench.run --json bench/results/$$(date -u +%Y-%m-%d).json

# The atheris fuzzers, then fault injection for SOAK_MINUTES (default 10); ends with
# `faults=N recovered=N lost_devices=0` (docs/RELIABILITY.md). Needs root, like colad.
SOAK_MINUTES ?= 10
soak: setup
	@$(VENV)/bin/python -c "import atheris" 2>/dev/null || $(VENV)/bin/pip install -q --disable-pip-version-check atheris
	$(VENV)/bin/python -m tests.chaos.soak --minutes $(SOAK_MINUTES) --fuzz-seconds 60

lint: setup
	$(VENV)/bin/ruff check colad tests bench
	$(VENV)/bin/ruff format --check colad tests bench
	$(VENV)/bin/mypy

# Regenerate the committed stubs from colad/api/*.proto, one protoc run per file: the device plugin
# v1beta1 and PodResources v1 copies, and the upstream kubelet protos of plugin registration v1,
# DRA v1 and v1beta1, and DRA health v1 and v1alpha1 (docs/DEVELOPING.md, "gRPC stubs", names their source).
API_PROTOS := deviceplugin podresources pluginregistration dra_v1 dra_v1beta1 dra_health_v1 dra_health_v1alpha1
stubs: $(PROTOC_VENV)/.installed
	for proto in $(API_PROTOS); do \
		$(PROTOC_VENV)/bin/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. \
			colad/api/$$proto.proto || exit 1; \
	done

# The Debian package, built with dh + pybuild from a clean copy of this tree (packaging/build-deb.sh).
# Prints the path of the .deb; the build log is dist/build-deb.log.
deb: deps
	@mkdir -p dist
	@packaging/build-deb.sh dist 2>dist/build-deb.log || { tail -n 40 dist/build-deb.log; exit 1; }

# colad's container image (packaging/kubernetes/Dockerfile) from the .deb of `make deb`, built with podman
# (or buildah) into the local image store. The last line printed is the image reference, localhost/colad:<version>.
image: deps image-base
	@mkdir -p dist
	@deb=$$(packaging/build-deb.sh dist 2>dist/build-deb.log) || { tail -n 40 dist/build-deb.log; exit 1; }; \
		$(PYTHON) -m tests.image build "$$deb"

# No registry is reachable: `debian:bookworm-slim` is imported into local storage from a debootstrapped
# bookworm minbase root, slimmed like Debian's own (tests/image.py), when it is missing.
image-base: deps
	@$(PYTHON) -m tests.image base

clean:
	rm -rf $(VENV) $(PROTOC_VENV) .sandbox build dist *.egg-info
