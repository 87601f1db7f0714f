"""A start users can trust: a member is listed JOINING until it serves its clients, `cluster`
never shows a null coordinator, `jetwake member start` prints one line when the member serves,
`jetwake cluster --wait N` returns once N members serve, and a client of a member that does
not serve yet gets a clear, retryable error (or waits for it with ``connect_retry``)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from jetwake import Client, Member, MemberNotServingError
from jetwake.engine.cluster.membership import KafkaMembership
from jetwake.engine.server.member_service import MemberService
from support.cluster_processes import TOKEN, ClusterProcesses
from support.ports import free_port
from support.process_stop import stop_gracefully
from support.waiting import wait_until

pytestmark = [pytest.mark.integration]

CLI = [sys.executable, "-m", "jetwake.engine.server.cli"]


def _answers(port: int) -> bool:
    """Whether something accepts connections on the loopback port now."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _env(address: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JETWAKE_")}
    return {**env, "JETWAKE_ADDRESS": address, "JETWAKE_TOKEN": TOKEN}


class _PipedMember:
    """A ``jetwake member start`` process whose stdout is read line by line (its log, on
    stderr, goes to a file)."""

    def __init__(self, tmp: Path, *args: str) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = tmp / f"member-{self.port}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [*CLI, "member", "start", "--port", str(self.port), "--token", TOKEN,
             "--cooperative-threads", "1", "--local-parallelism", "1", *args],
            stdout=subprocess.PIPE, stderr=self._log, text=True, env=_env(self.address))
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def stop(self) -> list[str]:
        """SIGTERM, then every line the process printed on stdout."""
        stop_gracefully(self.proc)
        self._reader.join(10)
        self._log.close()
        return self.lines

    def log(self) -> str:
        return self.log_path.read_text()


class _GroupWatch:
    """Watches the cluster's Kafka group on a thread of its own: how often it had members
    but none holding the control partition (no coordinator: a rebalance)."""

    def __init__(self, bootstrap: str, group: str) -> None:
        from confluent_kafka.admin import AdminClient
        self._admin = AdminClient({"bootstrap.servers": bootstrap})
        self._group = group
        self._stop = threading.Event()
        self.without_coordinator = 0
        self.seen = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                desc = self._admin.describe_consumer_groups([self._group])[self._group] \
                    .result(5)
            except Exception:  # noqa: BLE001 - the group may not answer for a moment
                continue
            self.seen += 1
            if desc.members and not any(
                    tp.partition == 0 for m in desc.members if m.assignment
                    for tp in m.assignment.topic_partitions):
                self.without_coordinator += 1

    def __enter__(self) -> "_GroupWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture
def cluster_members(tmp_path, kafka_bootstrap):
    """Member processes of a fresh cluster: ``start(n)`` starts n at once (without waiting);
    all are stopped afterwards."""
    started: list[_PipedMember] = []
    name = f"s{uuid.uuid4().hex[:10]}"

    def start(count: int, *extra: str) -> list[_PipedMember]:
        new = [_PipedMember(tmp_path, "--cluster", name, "--kafka", kafka_bootstrap,
                            "--data-dir", str(tmp_path / f"d{len(started) + i}"),
                            "--scale-up-delay", "1000", *extra) for i in range(count)]
        started.extend(new)
        return new

    start.name = name
    yield start
    for m in started:  # killed: a test that checks a graceful stop stops its member itself
        if m.proc.poll() is None:
            m.proc.kill()
        m.stop()


@pytest.mark.kafka
def test_member_start_prints_exactly_one_line_once_the_member_serves(cluster_members):
    member, = cluster_members(1)
    wait_until(lambda: member.lines or member.proc.poll() is not None, timeout=60,
               what=lambda: f"the ready line:\n{member.log()}")
    assert member.proc.poll() is None, member.log()
    line, = member.lines
    found = re.fullmatch(rf"jetwake member (\S+) of cluster '{cluster_members.name}' ready: "
                         rf"clients connect to {member.address}", line)
    assert found, line
    assert _answers(member.port)  # printed once it serves, not before
    with Client(member.address, token=TOKEN) as c:
        info = c.cluster()
    assert [(m["id"], m["address"], m["state"]) for m in info["members"]] == \
        [(found.group(1), member.address, "ACTIVE")]
    assert member.stop() == [line]  # nothing more on stdout, shutdown included


@pytest.mark.kafka
def test_a_member_whose_client_port_is_taken_exits_before_it_joins_its_cluster(
        cluster_members):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        member, = cluster_members(1, "--port", str(port))  # the last --port counts
        assert member.proc.wait(60) == 1, member.log()
    log = member.log()
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in log
    # refused before the member opened its peer port: no other member ever saw it
    assert "listens for peers" not in log and "joined cluster" not in log, log
    assert member.lines == []


def test_a_member_given_a_port_in_use_fails_and_leaves_its_data_directory_free(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError, match="in use"):
            Member(str(tmp_path / "d"), port=taken.getsockname()[1], token=TOKEN)
    again = Member(str(tmp_path / "d"), port=0, token=TOKEN)  # nothing was left locked
    again.shutdown()


@pytest.mark.kafka
def test_cluster_wait_returns_once_n_members_serve_retrying_a_member_still_starting(
        cluster_members):
    first, second = cluster_members(2)
    assert not _answers(first.port)  # the command starts before the member serves
    r = subprocess.run([*CLI, "cluster", "--wait", "2", "--timeout", "90", "--json"],
                       capture_output=True, text=True, timeout=120, env=_env(first.address))
    assert r.returncode == 0, f"{r.stderr}\n{first.log()}"
    info = json.loads(r.stdout)
    members = {m["address"]: m["state"] for m in info["members"]}
    assert members == {first.address: "ACTIVE", second.address: "ACTIVE"}
    assert info["coordinator"] in {m["id"] for m in info["members"]}
    assert info["election_in_progress"] is False


def test_cluster_wait_times_out_naming_how_many_members_serve(tmp_path):
    member = _PipedMember(tmp_path)  # a member alone: a cluster of one
    try:
        wait_until(lambda: member.lines, timeout=30, what=lambda: member.log())
        r = subprocess.run([*CLI, "cluster", "--wait", "2", "--timeout", "1"],
                           capture_output=True, text=True, timeout=60,
                           env=_env(member.address))
    finally:
        member.stop()
    assert r.returncode == 1
    assert r.stderr.strip() == (
        f"jetwake: error: timed out after 1 s waiting for 2 member(s) to serve clients: "
        f"1 serve (1 ACTIVE ({member.address})); try again with a longer --timeout, or start "
        f"the missing members")


@pytest.mark.kafka
def test_cluster_never_shows_a_null_coordinator_or_an_active_member_without_address(
        cluster_members, kafka_bootstrap):
    first, = cluster_members(1)
    wait_until(lambda: first.lines, timeout=60, what=lambda: first.log())
    answers: list[dict] = []
    group = _GroupWatch(kafka_bootstrap, f"jetwake-{cluster_members.name}")
    with Client(first.address, token=TOKEN) as c, group:
        second, = cluster_members(1)  # the group rebalances while it joins
        wait_until(lambda: answers.append(c.cluster()) or sum(
            m["state"] == "ACTIVE" for m in answers[-1]["members"]) == 2,
            timeout=90, interval=0.05, what=lambda: f"two members serving: {answers[-1:]}; "
            f"the second member's log:\n{second.log()}")
    # Kafka's group had no coordinator for a while, and the cluster was asked meanwhile
    assert group.without_coordinator > 0 and len(answers) > 1
    for info in answers:
        ids = {m["id"] for m in info["members"]}
        assert info["coordinator"] is not None, info
        assert info["coordinator"] in ids or (info["coordinator"] == "election in progress"
                                              and info["election_in_progress"]), info
        for m in info["members"]:
            assert m["state"] in ("JOINING", "ACTIVE"), info
            assert (m["state"] == "ACTIVE") == (m["address"] is not None), info


@pytest.mark.kafka
def test_cluster_says_the_election_is_in_progress_while_a_paused_member_holds_it_up(
        cluster_members, kafka_bootstrap):
    # a member paused (SIGSTOP) while another joins: Kafka's group waits for the paused one
    # to rejoin until its session times out (20 s here), with no coordinator meanwhile
    first, paused = cluster_members(2, "--session-timeout", "20000")
    wait_until(lambda: first.lines and paused.lines, timeout=60,
               what=lambda: f"both members serving:\n{first.log()}\n{paused.log()}")
    paused.proc.send_signal(signal.SIGSTOP)
    joining = KafkaMembership(kafka_bootstrap, cluster_members.name, "joining", "127.0.0.1:9")
    threading.Thread(target=joining.start, kwargs={"timeout": 60}, daemon=True).start()
    group = _GroupWatch(kafka_bootstrap, f"jetwake-{cluster_members.name}")
    try:
        with group:
            wait_until(lambda: group.without_coordinator, timeout=30,
                       what="the group rebalancing")
            with Client(first.address, token=TOKEN) as c:
                info = c.cluster()
    finally:
        paused.proc.send_signal(signal.SIGCONT)
        joining.stop()
    assert (info["coordinator"], info["election_in_progress"]) == ("election in progress", True)
    states = {m["address"]: m["state"] for m in info["members"] if m["address"]}
    assert states == {first.address: "ACTIVE"}  # the paused one does not answer


@pytest.mark.kafka
def test_a_member_of_a_cluster_is_listed_joining_until_it_serves_clients(
        tmp_path, kafka_bootstrap):
    cluster = f"s{uuid.uuid4().hex[:10]}"
    kw = dict(cluster=cluster, kafka_bootstrap_servers=kafka_bootstrap, token=TOKEN)
    first = Member(tmp_path / "a", port=0, **kw)
    # like `jetwake member start`: the member joins, then its caller opens its client port
    second = Member(tmp_path / "b", serves_clients=True, **kw)
    service = None
    try:
        def listed() -> dict:
            with Client(first.address, token=TOKEN) as c:
                return {m["id"]: m for m in c.cluster()["members"]}
        joining = wait_until(lambda: (m := listed()).get(second.member_id) and m,
                             what="the second member in the cluster")[second.member_id]
        assert (joining["state"], joining["address"]) == ("JOINING", None)
        service = MemberService(second, "127.0.0.1", 0, TOKEN).start()
        second.client_address = service.address_text
        active = listed()[second.member_id]
        assert (active["state"], active["address"]) == ("ACTIVE", service.address_text)
    finally:
        if service is not None:
            service.stop()
        second.shutdown()
        first.shutdown()


def test_a_client_of_a_member_that_does_not_serve_gets_a_clear_retryable_error():
    port = free_port()
    with pytest.raises(MemberNotServingError) as raised:
        Client(f"127.0.0.1:{port}", token=TOKEN)
    message = str(raised.value)
    assert raised.value.retryable
    assert message.startswith(f"no jetwake member serves clients at 127.0.0.1:{port}: nothing "
                              "accepts connections there. A member that is starting serves "
                              "once it has joined its cluster")
    assert "refused" not in message.lower()


def test_submit_to_a_member_that_does_not_serve_fails_with_the_clear_error(tmp_path):
    f = tmp_path / "job.py"
    f.write_text("from jetwake import Pipeline\npipeline = Pipeline()\n")
    address = f"127.0.0.1:{free_port()}"
    r = subprocess.run([*CLI, "submit", str(f)], capture_output=True, text=True, timeout=60,
                       env=_env(address))
    assert r.returncode == 3
    assert r.stderr.startswith(f"jetwake: error: no jetwake member serves clients at {address}:")
    assert "refused" not in r.stderr.lower()


def test_a_client_with_connect_retry_waits_for_a_member_that_is_starting(tmp_path):
    member = _PipedMember(tmp_path)
    try:
        assert not _answers(member.port)  # the client starts before the member serves
        with Client(member.address, token=TOKEN, connect_retry=60) as c:
            assert c.jobs() == []
    finally:
        member.stop()
