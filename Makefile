# jetwake developer commands. `make demo` and `make test` do all the set-up they need.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-unit test-integration bench kafka-up kafka-down venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,spark,bench]'
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/word_count.py
	$(PY) examples/streaming_windows.py

test: $(STAMP)
	$(PY) -m pytest tests

test-unit: $(STAMP)
	$(PY) -m pytest tests -m "not integration"

test-integration: $(STAMP)
	$(PY) -m pytest tests -m integration

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# A real Kafka broker (KRaft, no Docker) on 127.0.0.1:$KAFKA_PORT (default 9092); see docs/kafka-broker.md
kafka-up: $(STAMP)
	$(PY) docker/local-kafka/kafka_local.py up

kafka-down: $(STAMP)
	$(PY) docker/local-kafka/kafka_local.py down
