"""A job's restarts with back-off: the attempts to start it again after its execution ended
for a restartable cause, or after its member started again.

An attempt that fails for a restartable cause (:func:`is_restartable_cause`: a broker away, a
full disk) is tried again after 0.5 s, 1 s, 2 s, ... up to 30 s between attempts, until one
succeeds, the job is cancelled or the member shuts down (:meth:`RestartBackoff.stop`); each
failed attempt is an event, and the log says so for the first three and then at most once a
minute. A permanent cause ends the attempts (the job's start marked it failed).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from jetwake.engine.core.errors import JobStateError, is_restartable_cause

__all__ = ["RestartBackoff", "RESTART_BACKOFF_FIRST_S", "RESTART_BACKOFF_MAX_S"]

log = logging.getLogger("jetwake.job")

RESTART_BACKOFF_FIRST_S = 0.5
RESTART_BACKOFF_MAX_S = 30.0
# failed attempts beyond the first three are logged at most this often (each is still an event)
_LOG_EVERY_S = 60.0


class RestartBackoff:
    """Runs one job's restart attempts, one series at a time, on a thread of its own.

    ``attempt(n)`` makes the ``n``-th start attempt (raising why it failed); ``event(text)``
    records a job event; ``failure()`` is the job's failure text, for the log; ``settled()``
    runs after a series ended, however it ended."""

    def __init__(self, name: str, attempt: Callable[[int], None],
                 event: Callable[[str], None], failure: Callable[[], str | None],
                 settled: Callable[[], None]) -> None:
        self.name = name
        self._attempt = attempt
        self._event = event
        self._failure = failure
        self._settled = settled
        self._stop = threading.Event()  # no more attempts: cancel, member shutdown
        self._thread: threading.Thread | None = None
        self._last_log = 0.0
        #: start attempts of the series in progress
        self.attempts = 0

    @property
    def stopped(self) -> bool:
        """Whether attempts have stopped for good."""
        return self._stop.is_set()

    def stop(self) -> None:
        """No attempt is made any more; one waiting for its turn gives up."""
        self._stop.set()

    def begin(self, attempts_done: int = 0) -> None:
        """Starts a series of attempts in the background; ``attempts_done`` were made by the
        caller already (the next one then waits for its back-off first)."""
        thread = threading.Thread(target=self._run, args=(attempts_done,), daemon=True,
                                  name=f"jetwake-restart-{self.name}")
        self._thread = thread
        thread.start()

    def join(self, timeout: float) -> bool:
        """Waits for the series in progress (from another thread); whether none runs now."""
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def failed_attempt(self, attempt: int, error: BaseException | None, delay: float) -> None:
        """Reports a failed attempt and when the next one comes."""
        text = f"{type(error).__name__}: {error}"
        self._event(f"start attempt {attempt} failed ({text}); retrying in {delay:.1f} s")
        now = time.monotonic()
        if attempt <= 3 or now - self._last_log >= _LOG_EVERY_S:
            self._last_log = now
            log.warning("job %s: start attempt %d failed (%s); retrying in %.1f s%s", self.name,
                        attempt, text, delay,
                        "" if attempt < 3 else " (further attempts are logged at most once a "
                        "minute; each is a job event)")

    def _run(self, attempts_done: int) -> None:
        from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential

        count = attempts_done

        def attempt() -> None:
            nonlocal count
            if self._stop.is_set():
                raise JobStateError(f"job '{self.name}': restart abandoned (cancelled, or the "
                                    "member is shutting down)")
            count += 1
            self.attempts = count
            self._attempt(count)

        def report(state: RetryCallState) -> None:
            outcome, next_action = state.outcome, state.next_action
            self.failed_attempt(count, outcome.exception() if outcome else None,
                                next_action.sleep if next_action else 0.0)

        if attempts_done:  # the first attempt was made by the caller: wait before the next
            self._stop.wait(RESTART_BACKOFF_FIRST_S)
        retrying = Retrying(
            retry=retry_if_exception(is_restartable_cause),
            wait=wait_exponential(multiplier=RESTART_BACKOFF_FIRST_S, max=RESTART_BACKOFF_MAX_S),
            # cut short by stop() (tenacity ignores the result of sleep)
            sleep=self._stop.wait,  # type: ignore[arg-type]
            before_sleep=report, reraise=True)
        try:
            retrying(attempt)
        except BaseException as e:  # noqa: BLE001 - the start marked the job; say why here
            if self._stop.is_set():
                log.info("job %s: restart stopped (%s)", self.name, e)
            else:
                log.error("job %s could not restart: %s", self.name, self._failure() or repr(e))
        self._settled()
