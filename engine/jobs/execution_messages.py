"""The messages between a job's coordinator and the members that run its executions.

Each operation of an execution (init, start, snapshot phase 1 and its result, phase 2, end,
cancel, metrics) is a dataclass with a version. The transport encodes one as a dict of its
fields plus ``"v"`` (:meth:`ExecutionMessage.to_wire`) and decodes it with
:func:`decode`, which refuses another version, a missing field or an unknown one: a field
added on one side fails loudly on the other instead of being read as a default or dropped.
Calls to the coordinator's own member go through the same encoding, so both ends are
checked on every path.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from jetwake.engine.core.errors import JetwakeError

__all__ = [
    "ExecutionMessage", "MessageFormatError", "InitExecution", "Initialized", "StartExecution",
    "StartSnapshot", "CompletePhase1", "Phase1Result", "CompletePhase2", "Phase2Result",
    "CancelExecution", "ExecutionMetrics", "MemberCounts", "ExecutionEnded", "ForgetJob",
    "REQUESTS", "decode", "decode_request", "ExecutionTransport", "ReadState", "StateEntries",
]


class MessageFormatError(JetwakeError):
    """A message between members does not match this member's definition of it (another
    version, a field missing or unknown): the members run different versions of jetwake."""

    restartable = False


M = TypeVar("M", bound="ExecutionMessage")


@dataclass(frozen=True)
class ExecutionMessage:
    """Base of the messages: ``OP`` names the operation, ``VERSION`` its field set."""

    OP: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1
    #: the reply's message type; None for a request answered by nothing, or a reply
    REPLY: ClassVar["type[ExecutionMessage] | None"] = None

    def to_wire(self) -> dict[str, Any]:
        """The message as the transport sends it: its fields and its version."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["v"] = self.VERSION
        return out


def decode(cls: type[M], data: Any) -> M:
    """The ``cls`` message ``data`` encodes; raises :class:`MessageFormatError` when it is not
    one of this version with exactly its fields."""
    if not isinstance(data, dict):
        raise MessageFormatError(f"{cls.__name__}: expected a dict, got "
                                 f"{type(data).__name__}")
    version = data.get("v")
    if version != cls.VERSION:
        raise MessageFormatError(f"{cls.__name__}: version {version!r} received, this member "
                                 f"speaks version {cls.VERSION}")
    names = {f.name for f in dataclasses.fields(cls)}
    given = set(data) - {"v"}
    missing, unknown = names - given, given - names
    if missing or unknown:
        raise MessageFormatError(
            f"{cls.__name__} v{version}: "
            + "; ".join(part for part in (
                f"missing {sorted(missing)}" if missing else "",
                f"unknown {sorted(unknown)}" if unknown else "") if part))
    return cls(**{name: data[name] for name in names})


# --- requests (coordinator -> member) and their replies --------------------------------------


@dataclass(frozen=True)
class Initialized(ExecutionMessage):
    """A member's share is built, restored and initialized."""

    OP: ClassVar[str] = "exec.init/reply"
    processors: int


@dataclass(frozen=True)
class InitExecution(ExecutionMessage):
    """Build, restore and initialize the member's share of an execution (nothing runs yet).

    ``restore`` is the commit record (JSON) to restore, None for no state; ``skipped_damaged``
    names the newer snapshots found damaged, which the member weighs before restoring
    (see restore_plan.check_fallback); ``accept_fallback`` is the user's one-time consent.
    ``definition`` is the pickled job definition, empty for the coordinator's own member (it
    builds its share from the job's DAG itself)."""

    OP: ClassVar[str] = "exec.init"
    REPLY: ClassVar[type[ExecutionMessage]] = Initialized
    exec_key: str
    job_id: str
    job_name: str
    definition: bytes
    config: dict
    default_parallelism: int
    members: list  # [member id, peer address] in member-index order
    member_index: int
    coordinator: str  # the member the end is reported to
    restore: str | None
    restore_desc: str
    execution_count: int
    skipped_damaged: list = field(default_factory=list)
    accept_fallback: bool = False


@dataclass(frozen=True)
class StartExecution(ExecutionMessage):
    """Run the member's initialized share."""

    OP: ClassVar[str] = "exec.start"
    REPLY: ClassVar[type[ExecutionMessage] | None] = None
    exec_key: str


@dataclass(frozen=True)
class StartSnapshot(ExecutionMessage):
    """Start phase 1 of snapshot ``snapshot_id`` on the member."""

    OP: ClassVar[str] = "exec.snapshot"
    REPLY: ClassVar[type[ExecutionMessage] | None] = None
    exec_key: str
    snapshot_id: int
    terminal: bool


@dataclass(frozen=True)
class Phase1Result(ExecutionMessage):
    """The member's phase 1: its part of the snapshot (a commit record's JSON) and where its
    files are shared, or why it failed."""

    OP: ClassVar[str] = "exec.phase1/reply"
    ok: bool
    why: str | None = None
    part: str | None = None
    refs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CompletePhase1(ExecutionMessage):
    """Wait up to ``timeout`` for the member's phase 1, then sync and share its part."""

    OP: ClassVar[str] = "exec.phase1"
    REPLY: ClassVar[type[ExecutionMessage]] = Phase1Result
    exec_key: str
    snapshot_id: int
    timeout: float


@dataclass(frozen=True)
class Phase2Result(ExecutionMessage):
    """Whether every processor of the member finished phase 2 in time."""

    OP: ClassVar[str] = "exec.phase2/reply"
    done: bool


@dataclass(frozen=True)
class CompletePhase2(ExecutionMessage):
    """Commit (``success``) or roll back the member's part, waiting up to ``timeout``."""

    OP: ClassVar[str] = "exec.phase2"
    REPLY: ClassVar[type[ExecutionMessage]] = Phase2Result
    exec_key: str
    snapshot_id: int
    success: bool
    timeout: float


@dataclass(frozen=True)
class CancelExecution(ExecutionMessage):
    """Stop the member's share."""

    OP: ClassVar[str] = "exec.cancel"
    REPLY: ClassVar[type[ExecutionMessage] | None] = None
    exec_key: str


@dataclass(frozen=True)
class MemberCounts(ExecutionMessage):
    """What the member's processors of an execution counted (vertex -> counter -> value)."""

    OP: ClassVar[str] = "exec.metrics/reply"
    counts: dict


@dataclass(frozen=True)
class ExecutionMetrics(ExecutionMessage):
    """Ask for the member's counts of a running execution."""

    OP: ClassVar[str] = "exec.metrics"
    REPLY: ClassVar[type[ExecutionMessage]] = MemberCounts
    exec_key: str


@dataclass(frozen=True)
class ForgetJob(ExecutionMessage):
    """The job ended for good: drop the member's copies of its snapshots."""

    OP: ClassVar[str] = "exec.forget_job"
    REPLY: ClassVar[type[ExecutionMessage] | None] = None
    job_id: str


@dataclass(frozen=True)
class StateEntries(ExecutionMessage):
    """The entries the member's processors hold of a stage's state, in the form they save
    them: one serialized part per processor (``state_reading.entries_of`` reads it)."""

    OP: ClassVar[str] = "exec.read_state/reply"
    parts: list
    count: int | None = None  # the keys held, when only a count was asked


@dataclass(frozen=True)
class ReadState(ExecutionMessage):
    """Ask for the live state the member's processors of ``vertices`` hold for ``keys`` (all
    of it when None), or with ``count_only`` how many keys they hold:
    ``job.state(stage, consistency="latest")``."""

    OP: ClassVar[str] = "exec.read_state"
    REPLY: ClassVar[type[ExecutionMessage]] = StateEntries
    exec_key: str
    vertices: list
    keys: list | None
    count_only: bool = False


# --- member -> coordinator ---------------------------------------------------------------------


@dataclass(frozen=True)
class ExecutionEnded(ExecutionMessage):
    """A member's share ended, and how. ``restartable`` is the member's verdict on its own
    error (is_restartable_cause), so the coordinator never judges an error by its name;
    ``metrics`` is what its processors counted (None when it never ran)."""

    OP: ClassVar[str] = "exec.ended"
    exec_key: str
    member: str
    cancelled: bool
    error: str | None = None
    error_type: str | None = None
    restartable: bool = False
    error_tasklet: str | None = None
    metrics: dict | None = None


REQUESTS: dict[str, type[ExecutionMessage]] = {
    cls.OP: cls for cls in (InitExecution, StartExecution, StartSnapshot, CompletePhase1,
                            CompletePhase2, CancelExecution, ExecutionMetrics, ForgetJob,
                            ReadState)}
"""The operations a member serves, by name."""


def decode_request(op: str, args: list) -> ExecutionMessage:
    """The request a call of ``op`` carries (its one argument is the encoded message)."""
    cls = REQUESTS.get(op)
    if cls is None:
        raise MessageFormatError(f"unknown execution operation '{op}'")
    if len(args) != 1:
        raise MessageFormatError(f"{op}: expected one encoded message, got {len(args)} "
                                 "arguments")
    return decode(cls, args[0])


class ExecutionTransport(Protocol):
    """Delivers a request to a member (its own member in-process, the others over the
    network) and returns the decoded reply (None for an operation without one)."""

    def __call__(self, member_id: str, message: ExecutionMessage,
                 timeout: float) -> ExecutionMessage | None: ...
