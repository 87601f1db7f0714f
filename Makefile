# jetwake developer commands. `make demo`, `make test` and `make bench` do all the set-up they
# need, and each installs only what it uses (see "Set-up" below).
PYTHON ?= python3.11
# The virtual environment; another one can be named for a try-out: `make demo VENV=/tmp/v1`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo demo-backfill test test-unit test-integration conformance bench kafka-up kafka-down \
	venv clean browser postgres postgres-up postgres-down chaos

# ---- Set-up -------------------------------------------------------------------------------
# One stamp per set of extras: `make demo` installs the package alone, `make test` adds the
# `test` extra (pytest, hypothesis, import-linter, ...), `make bench` the `bench` extra. A stamp
# is redone when pyproject.toml changes, so `make test` after `make demo` installs the rest.
# `make test` installs the `spark` extra too (pyspark, pyarrow): the suite runs the Spark
# backfill on a real local Spark.
BASE_STAMP := $(VENV)/.installed-base
TEST_STAMP := $(VENV)/.installed-test
BENCH_STAMP := $(VENV)/.installed-bench

# The editable install maps the package, jetwake/ (with the code folders linked into it), with
# an import hook: a static .pth file would put the repository's root on sys.path, and every
# other folder there with it. For that strategy setuptools always emits an informational
# warning, "Editable installation ... folders in your working directory with the same name as
# your package may take precedence": here the folder of that name, jetwake/, *is* the package,
# so the warning does not apply. That one message is filtered (pip shows the build backend's
# warnings even with -q); every other warning still shows.
PIP_INSTALL := PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q

$(PY):
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(BASE_STAMP): pyproject.toml | $(PY)
	$(PIP_INSTALL) -e .
	@touch $@

$(TEST_STAMP): pyproject.toml | $(PY)
	$(PIP_INSTALL) -e '.[test,spark,postgres]'
	@touch $@ $(BASE_STAMP)

$(BENCH_STAMP): pyproject.toml | $(PY)
	$(PIP_INSTALL) -e '.[bench]'
	@touch $@ $(BASE_STAMP)

venv: $(BASE_STAMP)

# The dashboard's browser tests (tests/test_dashboard_browser.py) drive the operating system's
# Chromium through its chromedriver. As root with apt, the packages are installed when missing
# (nothing is done when they are there); otherwise, or if the install fails, those tests skip
# and say why. Nothing else is downloaded: Selenium is given the chromedriver's path.
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium and chromium-driver (the dashboard's browser tests)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  { apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && \
	      apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; }; } || \
	  echo "could not install Chromium: the dashboard's browser tests will skip"; \
	else \
	  echo "no Chromium, and not root with apt: the dashboard's browser tests will skip"; \
	fi

# The PostgreSQL tests (tests/test_postgres_*.py) start the operating system's PostgreSQL with
# tests/support/local_postgres/postgres_local.py. As root with apt, the package is installed when
# missing (nothing is done when it is there); otherwise, or if the install fails, those tests
# skip and say how to install it. POSTGRES_DSN names a server to use instead.
postgres:
	@if command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing postgresql (the PostgreSQL tests)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  { apt-get install -y -q postgresql >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && \
	      apt-get install -y -q postgresql >/dev/null 2>&1; }; } || \
	  echo "could not install PostgreSQL: the PostgreSQL tests will skip"; \
	else \
	  echo "no PostgreSQL, and not root with apt: the PostgreSQL tests will skip"; \
	fi

# ---- Commands -----------------------------------------------------------------------------
demo: $(BASE_STAMP)
	$(PY) examples/word_count.py
	$(PY) examples/streaming_windows.py

# the Spark backfill demo installs the `spark` extra (pyspark, pyarrow: large) on first use
demo-backfill: $(BASE_STAMP)
	$(PIP_INSTALL) -e '.[spark]'
	$(PY) examples/backfill_word_count.py

# --durations=30: every run's log ends with its 30 slowest tests (and fixtures' set-ups), so
# that what takes the suite's time is seen where it grows.
# -n $(TEST_WORKERS) --dist loadfile (pytest-xdist): the suite mostly waits (on Kafka, member
# processes, session timeouts), so two workers share two cores. A test module runs whole on one
# worker (its module fixtures, a broker or network of its own, are made once); each worker makes
# its own session fixtures (broker, PostgreSQL, Spark session, shared cluster) on free ports.
# `make test TEST_WORKERS=0` runs the suite in one process.
TEST_WORKERS ?= 2
test: $(TEST_STAMP) browser postgres
	$(PY) -m pytest tests -n $(TEST_WORKERS) --dist loadfile --durations=30

test-unit: $(TEST_STAMP)
	$(PY) -m pytest tests -m "not integration"

test-integration: $(TEST_STAMP) browser postgres
	$(PY) -m pytest tests -m integration

# The conformance suite (tests/test_conformance.py) with a large hypothesis budget: every runtime
# against the reference model of tests/reference/ on 300 drawn pipelines and inputs per test.
# tests/test_conformance_spark.py (the Spark backfill and the hand-off to a streaming job, over
# Kafka) runs a third of that per Spark test: each example is a few seconds of Spark.
# tests/test_conformance_cluster.py runs all of it on a cluster of three member processes;
# tests/test_conformance_kill.py a quarter, each on a member process SIGKILLed and restarted
# under exactly-once (a few seconds an example).
CONFORMANCE_EXAMPLES ?= 300
conformance: $(TEST_STAMP)
	JETWAKE_CONFORMANCE_EXAMPLES=$(CONFORMANCE_EXAMPLES) $(PY) -m pytest tests/test_conformance.py \
		tests/test_conformance_spark.py tests/test_conformance_cluster.py \
		tests/test_conformance_kill.py tests/reference

bench: $(BENCH_STAMP)
	$(PY) -m bench

# An exactly-once job on three members and three brokers of its own under a seeded nemesis for
# DURATION seconds (then until every fault kind happened once), every output record and the final
# state checked: `make chaos DURATION=1800 SEED=7`. See docs/reliability.md, "The nemesis".
DURATION ?= 120
SEED ?= 1
chaos: $(BASE_STAMP)
	$(PY) -m bench chaos --duration $(DURATION) --seed $(SEED)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# A real Kafka broker (KRaft, no Docker) on 127.0.0.1:$KAFKA_PORT (default 9092); see docs/kafka-broker.md
kafka-up: $(BASE_STAMP)
	$(PY) tests/support/local_kafka/kafka_local.py up

kafka-down: $(BASE_STAMP)
	$(PY) tests/support/local_kafka/kafka_local.py down

# A real PostgreSQL (the OS's, installed when missing as for `make test`) on
# 127.0.0.1:$POSTGRES_PORT (default 5432), database jetwake; see docs/postgres.md
postgres-up: $(BASE_STAMP) postgres
	$(PY) tests/support/local_postgres/postgres_local.py up

postgres-down: $(BASE_STAMP)
	$(PY) tests/support/local_postgres/postgres_local.py down
