"""jetwake: fault-tolerant, stateful, distributed stream processing for Python.

The public API; the implementation lives in ``jetwake.engine``, ``jetwake.snapshot`` and
``jetwake.connectors``.
"""

from .connectors.sinks import Sinks
from .connectors.sources import Sources
from .connectors.test_sources import TestSources
from .engine.client import (
    AuthenticationError, Client, MemberUnreachableError, RemoteJob, RemoteList, RemoteMap,
)
from .engine.abstract_processor import AbstractProcessor, FlatMapper
from .engine.dag import DAG, DagValidationError, Edge, RoutingPolicy, Vertex
from .engine.errors import (
    FallbackRefusedError, JetwakeError, JobCancelledError, JobNotFoundError, JobStateError,
    RestartableError, SnapshotError, SnapshotNotFoundError,
)
from .engine.items import Watermark
from .engine.job import Job
from .engine.job_config import JobConfig
from .engine.job_status import JobStatus
from .engine.member import Member
from .engine.meta_supplier import ProcessorMetaSupplier, ProcessorSupplier
from .engine.pipeline.aggregate import AggregateOperation, AggregateOperations
from .engine.pipeline.connector import Sink, Source
from .engine.pipeline.pipeline import (
    GroupedStage, Pipeline, PipelineError, SinkStage, Stage, WindowedGroupedStage, WindowedStage,
)
from .engine.pipeline.window_definition import WindowDefinition
from .engine.pipeline.window_result import KeyedWindowResult, WindowResult
from .engine.processors.insert_watermarks import TimestampError
from .engine.watermark_policy import WatermarkPolicy
from .engine.processor import BroadcastKey, Inbox, Outbox, Processor, ProcessorContext
from .engine.serialization import register_type
from .engine.traverser import Traverser

__version__ = "0.1.0"

__all__ = [
    "AbstractProcessor", "AggregateOperation", "AggregateOperations", "BroadcastKey", "DAG",
    "DagValidationError", "Edge", "FlatMapper", "GroupedStage", "Inbox", "JetwakeError", "Job",
    "JobCancelledError", "JobConfig", "JobNotFoundError", "JobStateError", "JobStatus", "Member",
    "Outbox", "Pipeline", "PipelineError", "Processor", "ProcessorContext",
    "ProcessorMetaSupplier", "ProcessorSupplier", "RoutingPolicy", "Sink", "SinkStage", "Sinks",
    "SnapshotNotFoundError", "Source", "Sources", "Stage", "Traverser", "Vertex", "Watermark",
    "register_type", "TestSources", "WindowDefinition", "WindowResult", "KeyedWindowResult",
    "WindowedStage", "WindowedGroupedStage", "WatermarkPolicy", "TimestampError",
    "Client", "RemoteJob", "RemoteMap", "RemoteList", "MemberUnreachableError",
    "AuthenticationError", "SnapshotError", "RestartableError", "FallbackRefusedError",
]
