"""jetwake: fault-tolerant, stateful, distributed stream processing for Python.

The public API; the implementation lives in ``jetwake.engine``, ``jetwake.snapshot`` and
``jetwake.connectors``.
"""

from jetwake.connectors.sinks import Sinks
from jetwake.connectors.sources import Sources
from jetwake.connectors.generated_sources import TestSources
from jetwake.engine.backfill import SparkRunner
from jetwake.engine.server.client import (
    AuthenticationError, Client, MemberNotServingError, MemberUnreachableError, RemoteJob,
    RemoteList, RemoteMap,
)
from jetwake.engine.core.abstract_processor import AbstractProcessor, FlatMapper
from jetwake.engine.core.dag import DAG, DagValidationError, Edge, RoutingPolicy, Vertex
from jetwake.engine.core.errors import (
    FallbackRefusedError, JetwakeError, JobCancelledError, JobNotFoundError, JobStateError,
    RestartableError, SnapshotError, SnapshotNotFoundError,
)
from jetwake.engine.core.stream_items import Watermark
from jetwake.engine.jobs.job import Job
from jetwake.engine.jobs.state_reading import StateQueryError, StateUnavailableError
from jetwake.engine.jobs.state_view import StateView
from jetwake.engine.jobs.job_config import JobConfig
from jetwake.engine.jobs.job_status import JobStatus
from jetwake.engine.server.member import Member
from jetwake.engine.core.meta_supplier import ProcessorMetaSupplier, ProcessorSupplier
from jetwake.engine.operations.aggregate import AggregateOperation, AggregateOperations
from jetwake.engine.pipeline.connector import Sink, Source
from jetwake.engine.pipeline.pipeline import (
    GroupedStage, Pipeline, PipelineError, SinkStage, Stage, WindowedGroupedStage, WindowedStage,
)
from jetwake.engine.operations.window_definition import WindowDefinition
from jetwake.engine.operations.window_result import KeyedWindowResult, WindowResult
from jetwake.engine.processors.insert_watermarks import TimestampError
from jetwake.engine.operations.watermark_policy import WatermarkPolicy
from jetwake.engine.core.processor import BroadcastKey, Inbox, Outbox, Processor, ProcessorContext
from jetwake.engine.core.serialization import register_type
from jetwake.engine.operations.service_factory import ServiceFactory, ServiceError
from jetwake.engine.core.traverser import Traverser
from jetwake.engine.core.errors import StateDropRefusedError, StateMigrationError
from jetwake.engine.jobs.upgrade_plan import UpgradePlan

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
    "MemberNotServingError",
    "AuthenticationError", "SnapshotError", "RestartableError", "FallbackRefusedError",
    "SparkRunner",
    "ServiceFactory", "ServiceError",
    "StateView", "StateQueryError", "StateUnavailableError",
    "UpgradePlan", "StateDropRefusedError", "StateMigrationError",
]
