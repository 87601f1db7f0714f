"""Runs one job on the member: plans it, starts its execution, and follows it to its end.

This is the coordinator side of a job (Jet's MasterContext): it owns the job's status and is
the only place that changes it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from .dag import DAG
from .errors import JobCancelledError, JobStateError
from .execution.plan import PlanContext, build_tasklets
from .execution.service import Execution
from .job_config import JobConfig
from .job_status import JobStatus

if TYPE_CHECKING:  # pragma: no cover
    from .member import Member

__all__ = ["JobCoordinator"]

log = logging.getLogger("jetwake.job")


class JobCoordinator:
    def __init__(self, member: "Member", job_id: str, definition: Any, config: JobConfig) -> None:
        self.member = member
        self.job_id = job_id
        self.definition = definition  # a Pipeline or a DAG
        self.config = config
        self.name = config.name or job_id
        self.submission_time = time.time()
        self.completion_time: float | None = None
        self.status = JobStatus.NOT_RUNNING
        self.error: BaseException | None = None
        self._execution: Execution | None = None
        self._user_cancelled = False
        self._lock = threading.RLock()
        self._ended = threading.Event()
        self.dag: DAG = self._compile()

    def _compile(self) -> DAG:
        from .pipeline.pipeline import Pipeline
        d = self.definition
        if isinstance(d, Pipeline):
            dag = d.to_dag(self._default_parallelism())
        elif isinstance(d, DAG):
            dag = d
        else:
            raise TypeError(f"new_job() expects a Pipeline or a DAG, got {type(d).__qualname__}")
        dag.validate()
        return dag

    def _default_parallelism(self) -> int:
        lp = self.config.local_parallelism
        return lp if lp > 0 else self.member.default_local_parallelism

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            self.status = JobStatus.STARTING
        try:
            ctx = PlanContext(job_id=self.job_id, job_name=self.name,
                              processing_guarantee=self.config.processing_guarantee,
                              default_parallelism=self._default_parallelism(),
                              member=self.member)
            tasklets = build_tasklets(self.dag, ctx)
            for t in tasklets:
                t.init()
        except BaseException as e:
            self._finish(JobStatus.FAILED, e)
            raise
        execution = Execution(self.name, tasklets, self._on_execution_end)
        with self._lock:
            self._execution = execution
            self.status = JobStatus.RUNNING
        log.info("job %s (%s) started: %d processors", self.name, self.job_id, len(tasklets))
        self.member.execution_service.submit(execution)

    def _on_execution_end(self, execution: Execution) -> None:
        if self._user_cancelled:
            self._finish(JobStatus.FAILED, JobCancelledError(f"job '{self.name}' was cancelled"))
        elif execution.error is not None:
            err = execution.error
            try:
                err.add_note(f"jetwake: job '{self.name}' failed in processor "
                             f"{execution.error_tasklet}")
            except AttributeError:  # pragma: no cover - BaseException without notes
                pass
            log.error("job %s failed in %s: %r", self.name, execution.error_tasklet, err)
            self._finish(JobStatus.FAILED, err)
        else:
            self._finish(JobStatus.COMPLETED, None)

    def _finish(self, status: JobStatus, error: BaseException | None) -> None:
        with self._lock:
            if self.status.is_terminal:
                return
            self.status = status
            self.error = error
            self.completion_time = time.time()
        log.info("job %s %s", self.name, status.value.lower())
        self._ended.set()

    def cancel(self) -> None:
        with self._lock:
            if self.status.is_terminal:
                raise JobStateError(f"job '{self.name}' is already {self.status.value}; "
                                    "only a running or suspended job can be cancelled")
            self._user_cancelled = True
            execution = self._execution
        if execution is not None:
            execution.cancel()
        else:
            self._finish(JobStatus.FAILED, JobCancelledError(f"job '{self.name}' was cancelled"))

    def join(self, timeout: float | None = None) -> None:
        if not self._ended.wait(timeout):
            raise TimeoutError(f"job '{self.name}' still {self.status.value} after {timeout} s")
        if self.error is not None:
            raise self.error

    def is_done(self) -> bool:
        return self._ended.is_set()

    def metrics(self) -> dict[str, dict[str, int]]:
        """Items in and out per vertex, summed over the vertex's processors on this member."""
        execution = self._execution
        out: dict[str, dict[str, int]] = {}
        if execution is None:
            return out
        for t in execution.tasklets:
            m = out.setdefault(t.context.vertex_name, {"items_in": 0, "items_out": 0})
            m["items_in"] += t.items_in
            m["items_out"] += t.items_out
        return out
