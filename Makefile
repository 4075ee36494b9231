# tokentrail: `make demo` (the main job) and `make test` (what CI runs).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: install jars claude-code demo why test test-unit test-integration bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test]"
	touch $@

# Apache Kafka's broker jars from Maven Central into .kafka/libs (cached in ~/.m2).
jars: install
	$(BIN)/tokentrail kafka fetch

# The real Claude Code CLI (npm, pinned in compose/claude_code/) for the end-to-end test.
claude-code: install
	$(BIN)/python -m compose.claude_code install

demo: install jars
	$(BIN)/tokentrail demo

# Why was the demo's broken rollout masked? Replays it from the demo's kept Kafka log.
why: install
	$(BIN)/tokentrail replay --last-demo

# Unit and integration tests; integration tests run on a real broker (KAFKA_BOOTSTRAP,
# else testcontainers, else the jar broker this session starts from .kafka/libs).
test: install jars
	$(BIN)/pytest -q -ra $(PYTEST_ARGS)

test-unit: install
	$(BIN)/pytest -q tests/unit

test-integration: install jars
	$(BIN)/pytest -q -ra tests/integration

clean:
	-$(BIN)/tokentrail kafka down
	rm -rf .tokentrail .pytest_cache
