"""JobConfig: how a job runs (name, guarantee, snapshots, restarts)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["JobConfig", "PROCESSING_GUARANTEES"]

PROCESSING_GUARANTEES = ("none", "at_least_once", "exactly_once")


@dataclass
class JobConfig:
    """Settings of one job; checked when created.

    ``processing_guarantee``: "none", "at_least_once" or "exactly_once".
    ``snapshot_interval_ms``: time from the end of one snapshot to the start of the next.
    ``initial_snapshot_name``: start from this exported snapshot.
    ``suspend_on_failure``: suspend (keeping the snapshot) instead of failing.
    ``local_parallelism``: default processors per vertex on each member (-1: the member's).
    ``state_backend``: "memory" or "rocksdb" for keyed state (rocksdb needs a data directory).
    ``state_cache_bytes``: the RocksDB backend's write-back cache per processor.
    ``accept_at_least_once_on_fallback``: when the newest snapshot is damaged, an exactly-once
    job with a transactional sink (``Sinks.kafka``, ``Sinks.list``) refuses to restore from an
    older one, because the damaged snapshot's phase 2 may already have committed output that
    the older one would write again. True accepts that (at-least-once for this restore).
    ``split_brain_protection``: in a cluster, run only while a quorum of members is present
    (more than half of the most members the job has run on), as in Jet: the job waits
    (NOT_RUNNING) while fewer are there, so two halves of a split cluster never both run it.
    ``auto_scaling``: in a cluster, a member that joins makes the job restart from a fresh
    snapshot to use it (after the member's scale-up delay), and a member that leaves makes it
    restart on the others; False: the job keeps its members, and losing one suspends a job
    that takes snapshots (a job without restarts it).
    ``arguments``: free-form facts about the submission (the CLI records the file and its
    arguments), kept in the job record.
    ``dry_run`` (with ``initial_snapshot_name``): ``new_job`` starts nothing and returns the
    :class:`~jetwake.engine.jobs.upgrade_plan.UpgradePlan`: the saved state each stage takes
    over, the state the job would drop and the stages that start empty.
    ``allow_state_drop``: start from ``initial_snapshot_name`` even when the new pipeline
    drops some of its saved state (refused otherwise, naming the stages).
    """

    name: str | None = None
    processing_guarantee: str = "none"
    snapshot_interval_ms: int = 10_000
    initial_snapshot_name: str | None = None
    suspend_on_failure: bool = False
    local_parallelism: int = -1
    state_backend: str = "memory"
    state_cache_bytes: int = 64 * 2**20
    accept_at_least_once_on_fallback: bool = False
    split_brain_protection: bool = False
    auto_scaling: bool = True
    arguments: dict = field(default_factory=dict)
    dry_run: bool = False
    allow_state_drop: bool = False

    def __post_init__(self) -> None:
        if self.name is not None and (not isinstance(self.name, str) or not self.name.strip()):
            raise ValueError(f"JobConfig.name must be a non-empty string or None, "
                             f"got {self.name!r}")
        if self.processing_guarantee not in PROCESSING_GUARANTEES:
            raise ValueError(
                f"JobConfig.processing_guarantee must be one of {', '.join(PROCESSING_GUARANTEES)}"
                f", got {self.processing_guarantee!r}")
        if not _is_int(self.snapshot_interval_ms) or self.snapshot_interval_ms < 1:
            raise ValueError(f"JobConfig.snapshot_interval_ms must be a positive int (ms), "
                             f"got {self.snapshot_interval_ms!r}")
        if self.initial_snapshot_name is not None and (
                not isinstance(self.initial_snapshot_name, str) or not self.initial_snapshot_name):
            raise ValueError("JobConfig.initial_snapshot_name must be a snapshot name or None, "
                             f"got {self.initial_snapshot_name!r}")
        if not _is_int(self.local_parallelism) or (
                self.local_parallelism < 1 and self.local_parallelism != -1):
            raise ValueError("JobConfig.local_parallelism must be a positive int or -1, "
                             f"got {self.local_parallelism!r}")
        if not isinstance(self.accept_at_least_once_on_fallback, bool):
            raise ValueError("JobConfig.accept_at_least_once_on_fallback must be True or False, "
                             f"got {self.accept_at_least_once_on_fallback!r}")
        for flag in ("split_brain_protection", "auto_scaling"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"JobConfig.{flag} must be True or False, "
                                 f"got {getattr(self, flag)!r}")
        for flag in ("dry_run", "allow_state_drop"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"JobConfig.{flag} must be True or False, "
                                 f"got {getattr(self, flag)!r}")
        if self.dry_run and not self.initial_snapshot_name:
            raise ValueError("JobConfig.dry_run shows what a job started from a snapshot does "
                             "with its saved state: give initial_snapshot_name too")
        if self.state_backend not in ("memory", "rocksdb"):
            raise ValueError("JobConfig.state_backend must be 'memory' or 'rocksdb', "
                             f"got {self.state_backend!r}")

    @classmethod
    def from_dict(cls, values: dict) -> "JobConfig":
        """A JobConfig from its fields as a job record or another member keeps them; fields
        this version does not know (written by a newer one) are left out."""
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in values.items() if k in known})

    @property
    def snapshots_enabled(self) -> bool:
        return self.processing_guarantee != "none"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
