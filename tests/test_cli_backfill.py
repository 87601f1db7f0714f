"""`jetwake backfill` as a user meets it: its help, its usage errors, its messages, the Spark
settings it adds to keep Spark's JVM logs off stderr, and what it prints for windows over
bounded input. Only the last test starts Spark; the others run ``main`` in this process, with
a stand-in for the SparkRunner where a run is needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from jetwake import Client, Member, SnapshotError
from jetwake.connectors.spark import BackfillResult
from jetwake.engine.server.cli import main
from jetwake.snapshot.store.snapshot_store import SnapshotStore

from support.ports import free_port

BIN = Path(sys.executable).parent

ITEMS_FILE = '''
from jetwake import Pipeline, Sinks, Sources

pipeline = Pipeline()
pipeline.read_from(Sources.items([1, 2, 3])).write_to(Sinks.noop())
'''

WINDOWS_FILE = '''
from jetwake import AggregateOperations, Pipeline, Sinks, Sources, WindowDefinition

pipeline = Pipeline()
(pipeline.read_from(Sources.items(range(100)))
    .with_timestamps(lambda x: x * 10, 0)
    .window(WindowDefinition.tumbling(100))
    .aggregate(AggregateOperations.counting())
    .write_to(Sinks.noop()))
'''


@pytest.fixture(autouse=True)
def no_environment(monkeypatch):
    monkeypatch.delenv("JETWAKE_TOKEN", raising=False)
    monkeypatch.delenv("JETWAKE_ADDRESS", raising=False)


@pytest.fixture
def items_file(tmp_path) -> Path:
    f = tmp_path / "items.py"
    f.write_text(ITEMS_FILE)
    return f


class RecordingRunner:
    """Stands in for SparkRunner: keeps what the CLI gives it and the log4j2 configuration its
    JVM would read, and returns an empty result."""

    made: list["RecordingRunner"] = []

    def __init__(self, master: str, conf: dict) -> None:
        self.master, self.conf, self.log_config = master, conf, None
        RecordingRunner.made.append(self)

    def run(self, pipeline, until, export_snapshot, member) -> BackfillResult:
        for option in self.conf.get("spark.driver.extraJavaOptions", "").split():
            if option.startswith("-Dlog4j2.configurationFile="):
                uri = option.split("=", 1)[1]
                self.log_config = Path(unquote(urlparse(uri).path)).read_text()
        return BackfillResult(counters={"stages": {}})

    def stop(self) -> None:
        pass


@pytest.fixture
def recording_runner(monkeypatch):
    pytest.importorskip("pyspark")
    import jetwake.engine.backfill as spark_package
    RecordingRunner.made = []
    monkeypatch.setattr(spark_package, "SparkRunner", RecordingRunner)
    return RecordingRunner


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_help_shows_the_args_after_a_double_dash(capsys):
    with pytest.raises(SystemExit) as e:
        main(["backfill", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    usage = out.splitlines()[0]
    assert usage.startswith("usage: jetwake backfill ")
    assert usage.endswith("FILE.py [-- ARGS...]")
    assert "ARGS after `--` are passed to it" in out
    assert "--spark-log-level LEVEL" in out


@pytest.mark.parametrize("until", ["-5", "no-such-offsets.json", "earliest"])
def test_a_bad_until_is_a_usage_error(capsys, items_file, until):
    code, out, err = run(capsys, "backfill", str(items_file), "--until", until)
    assert code == 2
    assert out == ""
    assert err.splitlines() == [err.strip()]
    assert err.startswith("jetwake: error: bad --until value: ") and repr(until) in err


def test_an_until_file_that_is_not_offsets_is_a_usage_error(capsys, items_file, tmp_path):
    offsets = tmp_path / "offsets.json"
    offsets.write_text('{"clicks": {"0": "end"}}')
    code, _, err = run(capsys, "backfill", str(items_file), "--until", str(offsets))
    assert code == 2
    assert "partitions and offsets of 'clicks' must be integers" in err


def test_a_master_the_runner_refuses_is_a_usage_error(capsys, items_file):
    code, out, err = run(capsys, "backfill", str(items_file), "--master", "")
    assert code == 2
    assert err.startswith("jetwake: error: bad --master value: ")
    assert len(err.splitlines()) == 1


def test_an_unknown_spark_log_level_is_a_usage_error(capsys, items_file):
    with pytest.raises(SystemExit) as e:
        main(["backfill", str(items_file), "--spark-log-level", "loud"])
    assert e.value.code == 2
    assert "invalid choice: 'LOUD'" in capsys.readouterr().err


def test_spark_logs_only_fatal_errors_from_its_start_by_default(capsys, items_file,
                                                                recording_runner):
    code, _, _ = run(capsys, "backfill", str(items_file), "--master", "local[1]")
    assert code == 0
    (runner,) = recording_runner.made
    assert runner.conf["spark.log.level"] == "FATAL"
    assert "rootLogger.level = fatal" in runner.log_config.splitlines()
    assert "logger.spark.level = fatal" in runner.log_config.splitlines()


def test_the_spark_log_level_option_sets_the_level(capsys, items_file, recording_runner):
    code, _, _ = run(capsys, "backfill", str(items_file), "--spark-log-level", "warn")
    assert code == 0
    (runner,) = recording_runner.made
    assert runner.conf["spark.log.level"] == "WARN"
    assert "rootLogger.level = warn" in runner.log_config.splitlines()


@pytest.mark.parametrize("master, quick_compiler", [("local[2]", True),
                                                    ("spark://127.0.0.1:7077", False)])
def test_a_local_master_keeps_the_runner_s_quick_compiler_option(
        capsys, items_file, recording_runner, master, quick_compiler):
    # the CLI's driver options replace the runner's -XX:TieredStopAtLevel=1 of a local master
    code, _, _ = run(capsys, "backfill", str(items_file), "--master", master)
    assert code == 0
    options = recording_runner.made[0].conf["spark.driver.extraJavaOptions"].split()
    assert ("-XX:TieredStopAtLevel=1" in options) == quick_compiler
    assert any(o.startswith("-Dlog4j2.configurationFile=file:") for o in options)


def test_the_user_s_driver_java_options_and_log_level_are_kept(capsys, items_file,
                                                               recording_runner):
    code, _, _ = run(capsys, "backfill", str(items_file),
                     "--conf", "spark.driver.extraJavaOptions=-Dmine=1",
                     "--conf", "spark.log.level=INFO")
    assert code == 0
    (runner,) = recording_runner.made
    assert runner.conf["spark.driver.extraJavaOptions"] == "-Dmine=1"
    assert runner.conf["spark.log.level"] == "INFO"
    assert runner.log_config is None


def test_the_log_configuration_is_removed_after_the_run(capsys, items_file, recording_runner):
    run(capsys, "backfill", str(items_file))
    options = recording_runner.made[0].conf["spark.driver.extraJavaOptions"].split()
    uri = next(o for o in options if o.startswith("-Dlog4j2.configurationFile="))
    path = Path(unquote(urlparse(uri.split("=", 1)[1]).path))
    assert not path.exists() and not path.parent.exists()


def test_no_member_for_the_snapshot_is_one_sentence_ending_in_the_client_s_question(
        capsys, items_file):
    port = free_port()
    code, _, err = run(capsys, "backfill", str(items_file), "--export-snapshot", "x",
                       "--address", f"127.0.0.1:{port}")
    assert code == 3
    line = err.strip()
    assert line.startswith("jetwake: error: --export-snapshot writes the snapshot on the member")
    assert "--data-dir DIR" in line
    assert line.endswith(f"Is it running ('jetwake member start --port {port}')?")
    assert "?." not in line


def test_a_taken_snapshot_name_in_a_data_dir_points_at_delete_snapshot(capsys, items_file,
                                                                       tmp_path):
    pytest.importorskip("pyspark")
    data = tmp_path / "data"
    data.mkdir()
    SnapshotStore(str(data)).write_export("taken", "earlier-backfill", [])
    code, _, err = run(capsys, "backfill", str(items_file), "--export-snapshot", "taken",
                       "--data-dir", str(data))
    assert code == 1
    assert "delete it (jetwake delete-snapshot taken) or choose another name" in err
    with pytest.raises(SystemExit) as e:   # the command it names exists
        main(["delete-snapshot", "--help"])
    assert e.value.code == 0


def test_a_taken_snapshot_name_on_the_member_service_points_at_delete_snapshot():
    with Member(port=0) as m, Client(m.address) as client:
        m.snapshot_store.write_export("taken", "earlier-backfill", [])
        with pytest.raises(SnapshotError) as e:
            client.write_snapshot("taken", "backfill", [])
    assert "delete it (jetwake delete-snapshot taken) or choose another" in str(e.value)


@pytest.mark.spark
@pytest.mark.integration
def test_windows_over_bounded_input_are_reported_all_closed(tmp_path):
    pytest.importorskip("pyspark")
    f = tmp_path / "windows.py"
    f.write_text(WINDOWS_FILE)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run([str(BIN / "jetwake"), "backfill", str(f), "--master", "local[1]"],
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "  window-aggregate: 100 in, 10 out" in proc.stdout.splitlines()
    assert "  every window closed (the input is bounded)" in proc.stdout.splitlines()
    assert str(sys.maxsize - 1) not in proc.stdout
