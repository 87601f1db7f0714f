"""`python -m bench chaos` for two minutes: an exactly-once job with RocksDB keyed state on
three member processes and three brokers, under the seeded nemesis (members and the
coordinator SIGKILLed and restarted, members paused, a member cut off where network
namespaces can be made, a broker SIGKILLed and restarted), ends with every output record
once and the final state exact (the harness's own check, bench/chaos/checker.py).

The run starts its own brokers: the nemesis kills brokers, which must not be the session's,
and a member cut off in a namespace reaches only brokers listening on the namespaces' bridge.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.faults]

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(1200)
def test_two_minutes_of_chaos_leave_every_record_once_and_the_state_exact(tmp_path):
    report_path = tmp_path / "chaos.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench", "chaos", "--duration", "120", "--seed", "3",
         "--brokers", "3", "--report", str(report_path)],
        cwd=REPO, capture_output=True, text=True, timeout=1100)
    assert report_path.exists(), f"exit {run.returncode}\n{run.stdout}\n{run.stderr[-3000:]}"
    report = json.loads(report_path.read_text())
    assert run.returncode == 0 and report["passed"], f"{report['problems']}\n{run.stdout}"
    kinds = {f["kind"] for f in report["faults"]}
    expected = {"kill-member", "kill-coordinator", "restart-member", "pause-member",
                "kill-broker", "restart-broker"}
    if report["partitions"] == "network namespaces":
        expected.add("partition-member")
    assert expected <= kinds, f"fault kinds {sorted(kinds)}: {sorted(expected - kinds)} missing"
    assert report["input_records"] == report["output_records"] > 0
    assert all(f["recovered_s"] is not None for f in report["faults"]), report["faults"]
    assert report["catch_up_s"] is not None
    assert set(report["memory_mib"]) == {"member-1", "member-2", "member-3"}
