"""The backfill beyond one process: the `jetwake backfill` command, and a real standalone Spark
cluster (a master and two workers started from the pyspark package's scripts, on loopback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from support.ports import free_port, free_ports
from support.waiting import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BIN = Path(sys.executable).parent

PIPELINE_FILE = '''
import sys
from jetwake import AggregateOperations, Pipeline, Sinks, Sources

words = sys.argv[1:] * 100
pipeline = Pipeline()
(pipeline.read_from(Sources.items(words))
    .group_by(lambda w: w)
    .aggregate(AggregateOperations.counting())
    .map(lambda kv: f"{kv[0]} {kv[1]}")
    .write_to(Sinks.files(OUT)))
'''


@pytest.fixture
def spark_installed():
    """Skips a test that runs Spark where pyspark is not installed."""
    pytest.importorskip("pyspark")


def test_the_backfill_command_runs_a_pipeline_file_on_spark(spark_installed, tmp_path):
    out = tmp_path / "out"
    f = tmp_path / "wc.py"
    f.write_text(PIPELINE_FILE.replace("OUT", repr(str(out))))
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run([str(BIN / "jetwake"), "backfill", str(f), "--master", "local[1]",
                           "--conf", "spark.ui.enabled=false", "--", "to", "be", "to"],
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "backfill done" in proc.stdout
    lines = sorted(line for p in out.iterdir() for line in p.read_text().splitlines())
    assert lines == ["be 100", "to 200"]


FAILING_FILE = '''
from jetwake import Pipeline, Sinks, Sources

def parse(x):
    return 10 // (x - 5)

pipeline = Pipeline()
pipeline.read_from(Sources.items(range(10))).map(parse).set_name("parse").write_to(Sinks.noop())
'''


def test_the_backfill_command_reports_a_failing_function_where_it_raised(spark_installed,
                                                                          tmp_path):
    f = tmp_path / "failing.py"
    f.write_text(FAILING_FILE)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run([str(BIN / "jetwake"), "backfill", str(f), "--master", "local[1]",
                           "--conf", "spark.ui.enabled=false"],
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode != 0
    # the worker's traceback names the line of the user's function, the last line the error
    assert f'File "{f}", line 5, in parse' in proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        "jetwake: error: stage 'parse' (map) failed in a Spark task: ZeroDivisionError: "
        "integer division or modulo by zero")
    # and no Spark logs: not the executor's ERROR lines with their Java frames, nor the
    # start-up lines (the JVM's own incubator-module warning cannot be turned off)
    assert proc.stderr.count("Traceback (most recent call last)") == 1
    assert " ERROR " not in proc.stderr and " WARN " not in proc.stderr
    assert "\tat org.apache.spark" not in proc.stderr
    assert "log level" not in proc.stderr


def test_the_backfill_command_refuses_a_bad_conf_and_a_snapshot_with_no_member(tmp_path):
    f = tmp_path / "wc.py"
    f.write_text(PIPELINE_FILE.replace("OUT", repr(str(tmp_path / "out"))))
    bad = subprocess.run([str(BIN / "jetwake"), "backfill", str(f), "--conf", "nonsense"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "expected KEY=VALUE" in bad.stderr
    nobody = f"127.0.0.1:{free_port()}"
    no_member = subprocess.run([str(BIN / "jetwake"), "backfill", str(f), "--export-snapshot",
                                "x", "--address", nobody],
                               capture_output=True, text=True, timeout=60)
    assert no_member.returncode == 3, no_member.stderr
    assert "no member answers at --address" in no_member.stderr
    assert "--data-dir DIR" in no_member.stderr


KAFKA_PIPELINE_FILE = '''
from jetwake import AggregateOperations, Pipeline, Sinks, Sources

pipeline = Pipeline()
(pipeline.read_from(Sources.kafka(TOPIC, {"bootstrap.servers": SERVERS},
                                  key_deserializer="str", value_deserializer="str"))
    .group_by(lambda kv: kv[0])
    .rolling_aggregate(AggregateOperations.counting())
    .write_to(Sinks.list("counts")))
'''


@pytest.mark.kafka
def test_the_backfill_command_hands_off_through_the_member_at_address(
        spark_installed, tmp_path, kafka_bootstrap, kafka_topic):
    from confluent_kafka import Producer

    from jetwake import Member
    topic = kafka_topic(partitions=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(30):
        producer.produce(topic, str(i).encode(), f"k{i % 3}".encode())
    assert producer.flush(30) == 0
    f = tmp_path / "counts.py"
    f.write_text(KAFKA_PIPELINE_FILE.replace("TOPIC", repr(topic))
                 .replace("SERVERS", repr(kafka_bootstrap)))
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    with Member(port=0) as m:
        proc = subprocess.run([str(BIN / "jetwake"), "backfill", str(f), "--master", "local[1]",
                               "--export-snapshot", "counted", "--address", m.address, "--json"],
                              capture_output=True, text=True, timeout=180, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        snapshot = m.snapshot_store.read(m.snapshot_store.get_export("counted"))
        # every key's count, as the streaming job's rolling aggregate would hold it
        state = {k: v for k, v in snapshot["rolling-aggregate"]}
        assert state == {"k0": 10, "k1": 10, "k2": 10}
        assert sorted(m.get_list("counts"))[-1] == ("k2", 10)


@pytest.fixture
def standalone_cluster(tmp_path):
    """``spark://127.0.0.1:PORT`` with two workers of one core each, stopped afterwards."""
    pyspark = pytest.importorskip("pyspark")
    spark_home = os.path.dirname(pyspark.__file__)
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    # four ports at once: a worker's web UI must not take the master's before it binds it
    port, web, *worker_webs = free_ports(4)
    env = {**os.environ, "SPARK_HOME": spark_home, "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(tmp_path),
           "SPARK_WORKER_DIR": str(tmp_path / "work")}
    procs = []

    def start(*args: str, log: str) -> subprocess.Popen:
        p = subprocess.Popen([spark_class, *args], env=env, stdout=open(tmp_path / log, "w"),
                             stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(p)
        return p
    master = f"spark://127.0.0.1:{port}"
    start("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
          str(port), "--webui-port", str(web), log="master.log")
    for i in range(2):
        start("org.apache.spark.deploy.worker.Worker", master, "--host", "127.0.0.1",
              "--cores", "1", "--memory", "512m", "--webui-port", str(worker_webs[i]),
              log=f"worker{i}.log")

    def workers_registered() -> bool:
        # the master's status page lists its workers once they registered
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{web}/json/", timeout=2) as r:
                return json.load(r).get("aliveworkers", 0) >= 2
        except (OSError, ValueError):  # not up yet, or a page that is not the status yet
            return False
    try:
        wait_until(workers_registered, timeout=90, interval=0.1,
                   what=lambda: "the standalone cluster to start: "
                   + (tmp_path / "master.log").read_text()[-2000:])
        yield master
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_a_backfill_runs_on_a_standalone_cluster_of_two_workers(standalone_cluster,
                                                                  tmp_path):
    # in a process of its own (a process has one SparkContext; the other tests share a local one)
    out = tmp_path / "out"
    f = tmp_path / "wc.py"
    f.write_text(PIPELINE_FILE.replace("OUT", repr(str(out))))
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [str(BIN / "jetwake"), "backfill", str(f), "--master", standalone_cluster, "--json",
         "--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=2",
         "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.default.parallelism=4",
         "--", "to", "be", "or", "not", "to", "be"],
        capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = sorted(line for p in out.iterdir() for line in p.read_text().splitlines())
    assert lines == ["be 200", "not 100", "or 100", "to 200"]
    # each worker ran an executor of the application
    apps = list((tmp_path / "work").iterdir())
    assert len(apps) == 1 and len(list(apps[0].iterdir())) == 2
