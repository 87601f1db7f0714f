"""Tools for testing processors and jobs (see docs/testing.md).

``verify_processor(supplier)`` runs a processor through its contract in several ways (plainly,
with a refusing outbox, with a snapshot and a restore into a fresh processor after every inbox
chunk) and checks each run's output. ``TestSources.items`` with its ``ABORT()`` and
``WAIT_FOR_SNAPSHOT()`` sentinels fails a real job at a chosen item, deterministically.
"""

from jetwake.connectors.generated_sources import TestAbort, TestSources
from jetwake.engine.verification.processor_verifier import ProcessorVerifier, verify_processor, wm

__all__ = ["verify_processor", "ProcessorVerifier", "wm", "TestSources", "TestAbort"]
