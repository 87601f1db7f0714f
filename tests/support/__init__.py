"""What the test modules share: the helpers they import (``from support.waiting import
wait_until``), the pytest plugin of the Kafka broker, and the scripts the fault tests run as
processes and kill.

The test modules find this package because pytest (its default "prepend" import mode) puts
tests/ on sys.path: tests/ has no __init__.py, so its modules and conftest.py import from
there. The scripts are run by path, and each puts tests/ on sys.path itself before importing
from here. ``tests/reference/`` stays apart: it is the conformance suite's reference model,
not a helper.

- ``waiting``: ``wait_until``, the one way a test waits for something; ``poll_until``, the
  same wait that returns on a timeout (for the scripts run as processes, and clean-ups);
  ``stays_true``, a watch that something does not happen for a while.
- ``clock``: ``ControlledClock``, moved by hand in tests of clock-driven code.
- ``restores``: which snapshots a member process restored its jobs from, for the kill tests.
- ``ports``: ``free_port``.
- ``process_stop``: ``stop_gracefully``, SIGTERM then SIGKILL after a deadline, for the member
  processes a test stops.
- ``package_files``: the files of the jetwake package, the code folders' links followed.
- ``kafka_broker``: the pytest plugin of the Kafka broker (tests/conftest.py loads it), with
  ``local_kafka/kafka_local.py`` (also ``make kafka-up``).
- ``cluster_processes``: member processes of a cluster (``jetwake member start``), and the
  ``three`` fixture; ``cluster_sums``: the exactly-once rolling-sum job over Kafka they run,
  and ``SumsRun``, the failover tests' driver of it (fed, killed under, checked exactly once).
- ``cli_member``: a ``jetwake member start`` process and ``jetwake`` commands against it.
- ``kafka_job``: the Kafka fault tests' job process, its input and the exactly-once check.
- ``dashboard``: a ``jetwake member start`` process with the dashboard on, HTTP calls that keep
  an error's status, a streaming job file.
- ``network_partition``: Linux network namespaces on one bridge, to cut members off (as root).
- ``snapshot_fixtures``: a throttled counting source and a keyed running sum, both saving state.
- ``spark_fixtures``: one local SparkSession for the session (``spark_runner``), and running a
  pipeline on Spark and on an embedded member; ``spark_handoff``: the hand-off tests' job.
- ``window_reference``: windows computed the obvious way, for the window tests to compare with.
- scripts the fault tests run and SIGKILL: ``member_process.py``, ``state_shapes_process.py``,
  ``kafka_job_process.py``, ``conformance_process.py``.
"""
