"""The seeded nemesis of ``python -m bench chaos``: one fault at a time, each followed by a
wait (bounded) until the output flows again.

The faults: SIGKILL of a member other than the coordinator (``kill-member``) or of the
coordinator on purpose (``kill-coordinator``), each followed by ``restart-member`` (a new
process on the killed member's data directory and address); SIGSTOP of a member, the
coordinator among them, and SIGCONT after 2-8 s (``pause-member``: either side of the 6 s
session timeout); a member cut off from everything, Kafka and its peers, for 3-10 s
(``partition-member``, where network namespaces can be made); SIGKILL of a broker
(``kill-broker``, with three brokers), followed by ``restart-broker``. The kinds are drawn
from a shuffled bag, so each occurs once before any occurs twice, and a run goes on past its
duration until each kind has happened at least once.
"""

from __future__ import annotations

import random
import signal
import time
from dataclasses import asdict, dataclass
from typing import Any

from bench.chaos.harness import Brokers, Members, Output

RESTORES = {"kill-member": "restart-member", "kill-coordinator": "restart-member",
            "kill-broker": "restart-broker"}


@dataclass
class Fault:
    kind: str
    target: str
    at_s: float  # seconds from the start of the run
    lasted_s: float  # how long the fault itself was applied (pauses, partitions)
    recovered_s: float | None  # from the fault to output flowing again; None: not within bound
    stretch_s: float  # the longest stretch without output from the fault to recovery

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fault_kinds(brokers: int, partitions: bool) -> list[str]:
    kinds = ["kill-member", "kill-coordinator", "pause-member"]
    if partitions:
        kinds.append("partition-member")
    if brokers >= 3:
        kinds.append("kill-broker")
    return kinds


class Nemesis:
    """Runs faults against ``members`` (and ``brokers``) while ``output`` is read."""

    def __init__(self, members: Members, brokers: Brokers, output: Output, net: Any,
                 seed: int, t0: float, rate: int, recovery_bound: float = 120.0,
                 log: Any = print) -> None:
        self.members = members
        self.brokers = brokers
        self.output = output
        self.net = net
        self.rng = random.Random(seed)
        self.t0 = t0
        self.rate = rate
        self.recovery_bound = recovery_bound
        self.log = log
        self.kinds = fault_kinds(brokers.nodes, net is not None)
        self.faults: list[Fault] = []
        self._bag: list[str] = []
        self._pending: list[tuple[str, Any]] = []  # restores owed: (kind, target)
        # members that exited by themselves (not killed here): (seconds, member, log line)
        self.exits: list[dict[str, Any]] = []

    # -- the loop ------------------------------------------------------------------------

    def run(self, until: float, hard_stop: float) -> None:
        """Faults until the monotonic time ``until`` and every kind happened (never past
        ``hard_stop``), then restores whatever is still down."""
        required = set(self.kinds) | {RESTORES[k] for k in self.kinds if k in RESTORES}
        while time.monotonic() < hard_stop:
            done = {f.kind for f in self.faults}
            if not self._pending and time.monotonic() >= until and required <= done:
                break
            self.step()
            time.sleep(self.rng.uniform(1.0, 3.0))  # steady running between faults
        self.heal_all()

    def restart_exited(self) -> None:
        """Starts again, as a supervisor would, a member whose process ended although the
        nemesis did not kill it (a member that fails to start exits), and notes it."""
        owed = {id(t) for kind, t in self._pending if kind == "restart-member"}
        for m in self.members.members:
            if m.proc is not None and not m.alive() and id(m) not in owed:
                exit_ = {"at_s": round(time.monotonic() - self.t0, 1),
                         "member": f"member-{m.slot}", "status": m.proc.returncode,
                         "log": m.last_log_line()[-300:]}
                self.exits.append(exit_)
                self.log(f"   {exit_['at_s']:8.1f} s  member-{m.slot} exited by itself "
                         f"(status {exit_['status']}): {exit_['log']}; started again")
                m.start()

    def step(self) -> None:
        self.restart_exited()
        if self._pending:
            kind, target = self._pending.pop(0)
        else:
            if not self._bag:
                self._bag = list(self.kinds)
                self.rng.shuffle(self._bag)
            kind, target = self._bag.pop(), None
        started = time.monotonic()
        name, lasted = getattr(self, "_" + kind.replace("-", "_"))(target)
        self._recovered(kind, name, started, started + lasted)

    def _recovered(self, kind: str, target: str, started: float, applied_until: float) -> None:
        """Waits until output flows again after the fault: a quarter second's worth of
        records arrived after it was lifted (and at least half a second after it began, so a
        commit in flight when it began does not count)."""
        since = max(applied_until, started + 0.5)
        deadline = since + self.recovery_bound
        want = max(1, self.rate // 4)
        recovered = None
        while time.monotonic() < deadline:
            if self.output.arrived_since(since) >= want:
                recovered = time.monotonic()
                break
            time.sleep(0.05)
        if recovered is None:
            stretch = self.output.longest_stall(started, time.monotonic())
        else:
            stretch = self.output.longest_stall(started, recovered)
        fault = Fault(kind, target, round(started - self.t0, 2),
                      round(applied_until - started, 2),
                      None if recovered is None else round(recovered - started, 2),
                      round(stretch, 2))
        self.faults.append(fault)
        self.log(f"   {fault.at_s:8.1f} s  {kind:<17} {target:<10} "
                 + (f"output again after {fault.recovered_s:.1f} s" if recovered is not None
                    else f"no output within {self.recovery_bound:.0f} s")
                 + f" (longest stretch without output {fault.stretch_s:.1f} s)")

    # -- the faults (each returns its target's name and how long it was applied) ----------

    def _kill(self, coordinator: bool) -> tuple[str, float]:
        live = self.members.live()
        chosen = self.members.coordinator() if coordinator else None
        if not coordinator:
            coord = self.members.coordinator()
            live = [m for m in live if m is not coord] or live
        victim = chosen or self.rng.choice(live)
        victim.signal(signal.SIGKILL)
        self._pending.append(("restart-member", victim))
        return f"member-{victim.slot}", 0.0

    def _kill_member(self, _target: Any) -> tuple[str, float]:
        return self._kill(False)

    def _kill_coordinator(self, _target: Any) -> tuple[str, float]:
        return self._kill(True)

    def _restart_member(self, member: Any) -> tuple[str, float]:
        member.start()
        return f"member-{member.slot}", 0.0

    def _pause_member(self, _target: Any) -> tuple[str, float]:
        victim = self.rng.choice(self.members.live())
        pause = self.rng.uniform(2.0, 8.0)
        victim.signal(signal.SIGSTOP)
        time.sleep(pause)
        victim.signal(signal.SIGCONT)
        return f"member-{victim.slot}", pause

    def _partition_member(self, _target: Any) -> tuple[str, float]:
        victim = self.rng.choice(self.members.live())
        cut = self.rng.uniform(3.0, 10.0)
        self.net.cut(victim.slot)
        time.sleep(cut)
        self.net.heal(victim.slot)
        return f"member-{victim.slot}", cut

    def _kill_broker(self, _target: Any) -> tuple[str, float]:
        node = self.rng.choice([n for n in range(1, self.brokers.nodes + 1)
                                if n not in self.brokers.down])
        self.brokers.kill(node)
        self._pending.append(("restart-broker", node))
        return f"broker-{node}", 0.0

    def _restart_broker(self, node: int) -> tuple[str, float]:
        self.brokers.restart(node)
        return f"broker-{node}", 0.0

    # -- the end -------------------------------------------------------------------------

    def heal_all(self) -> None:
        """SIGCONT to every member, every partition healed, every killed member and broker
        started again."""
        for m in self.members.members:
            if m.alive():
                m.signal(signal.SIGCONT)
        if self.net is not None:
            self.net.heal_all()
        for kind, target in self._pending:
            if kind == "restart-member" and not target.alive():
                target.start()
            elif kind == "restart-broker":
                self.brokers.restart(target)
        self._pending.clear()
        self.restart_exited()
