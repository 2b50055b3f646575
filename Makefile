# Two commands on a fresh machine: `make up` (set up, then run torpor) and `make test`.
VENV := .venv
BIN := $(VENV)/bin
SETUP_STAMP := $(VENV)/.torpor-setup

.PHONY: up test unit setup lint typecheck imports k8s-bins registry-bin rootfs images criu pytest

setup: $(SETUP_STAMP)

$(SETUP_STAMP): pyproject.toml scripts/setup.sh
	scripts/setup.sh
	touch $@

# Extra flags: make up ARGS="--api-port 8000"
up: setup criu
	$(BIN)/torpor up $(ARGS)

# The Kubernetes test binaries (cached outside the repo); without Go they are skipped off CI.
k8s-bins:
	@if ! scripts/build-k8s.sh >/dev/null; then \
	  if [ "$$CI" = "true" ]; then echo "make: scripts/build-k8s.sh failed" >&2; exit 1; fi; \
	  echo "make: scripts/build-k8s.sh failed; Kubernetes tests will skip" >&2; \
	fi

# The OCI registry of the Kubernetes test rig (go-containerregistry's crane; cached outside the
# repo; a small Go build).
registry-bin:
	@if ! scripts/build-registry.sh >/dev/null; then \
	  if [ "$$CI" = "true" ]; then echo "make: scripts/build-registry.sh failed" >&2; exit 1; fi; \
	  echo "make: scripts/build-registry.sh failed; registry tests will skip" >&2; \
	fi

# The local runtime's sandbox root filesystem (Debian via debootstrap, cached outside the repo;
# instant when the package list is unchanged). Local-runtime tests fail without it.
rootfs:
	@scripts/build-rootfs.sh >/dev/null

# code-interpreter-v1's layers on that rootfs (scripts/build-code-interpreter.sh: PyPI into a venv,
# the execution server; cached in ~/.cache/torpor/layers, instant when nothing changed). Rebuilt
# here too because the server layer follows services/interpreter, which setup's stamp does not.
code-interpreter: rootfs
	@scripts/build-code-interpreter.sh >/dev/null

# The images of the real test node and of testcontainers (scripts/build-images.sh: buildah, no
# Docker engine; cached outside the repo). Needs root; off CI a failure only makes those tests skip.
images: setup rootfs
	@if ! scripts/build-images.sh >/dev/null; then \
	  if [ "$$CI" = "true" ]; then echo "make: scripts/build-images.sh failed" >&2; exit 1; fi; \
	  echo "make: scripts/build-images.sh failed; realnode tests will skip" >&2; \
	fi

# CRIU 4.2.x for the memory-keeping pause (Debian sid's package unpacked by debootstrap, cached
# outside the repo; instant once built). Without it a pause keeps files only (process replay).
criu:
	@if ! scripts/build-criu.sh >/dev/null; then \
	  if [ "$$CI" = "true" ]; then echo "make: scripts/build-criu.sh failed" >&2; exit 1; fi; \
	  echo "make: scripts/build-criu.sh failed; pauses keep files only (process replay)" >&2; \
	fi

lint: setup
	$(BIN)/ruff check .

typecheck: setup
	$(BIN)/mypy

imports: setup
	$(BIN)/lint-imports

# pytest exit code 5 ("no tests collected") is a failure, not a pass. --durations: the CI log
# names the slowest tests, where the 25-minute target has to be won. Two workers (the machine's
# cores; most tests wait on pods, not the CPU); tests on a Kubernetes rig share one worker
# (tests/conftest.py puts them in the xdist group "node"). PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2
pytest: setup k8s-bins registry-bin rootfs code-interpreter images criu
	$(BIN)/pytest tests -n $(PYTEST_WORKERS) --dist loadgroup --durations=40 $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make: pytest collected no tests" >&2; exit 1; fi; exit $$rc

test: setup lint typecheck imports pytest

# The fast tier: modules marked `unit` (in-memory fakes from tests/fakes/; no nats-server, no
# subprocess, no connection: tests/conftest.py fails a unit test that tries). Plugins are loaded
# explicitly: the autoloaded ones (schemathesis, playwright) cost seconds of start-up.
UNIT_TESTS := tests/unit $(wildcard tests/domain) tests/scheduler/test_expiry_rules.py \
  tests/lifecycle/test_decisions.py tests/security/test_redaction.py \
  tests/runtime_local/test_templates.py tests/api/test_e2b_routes.py tests/api/test_native_routes.py \
  tests/templates/test_layers.py tests/templates/test_hostile_context.py

# A private --basetemp: pytest's default one first sweeps old runs' leftovers under /tmp, which
# can take minutes on a shared machine.
unit: setup
	@d=$$(mktemp -d); PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(BIN)/pytest -p asyncio -p timeout \
	  -p no:cacheprovider --basetemp=$$d/t -m unit -q $(UNIT_TESTS) $(PYTEST_ARGS); \
	  rc=$$?; rm -rf $$d; exit $$rc
