"""Job initialization in Jet's three steps: meta-supplier -> per-member supplier -> processors.

The meta-supplier runs once per job on the coordinator and gives each member a
:class:`ProcessorSupplier`; that runs on the member and creates the member's processors. A
source reading external partitions decides in ``ProcessorMetaSupplier.get`` which member reads
what, and in ``ProcessorSupplier.get`` which local processor does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from jetwake.engine.core.processor import Processor

__all__ = [
    "ProcessorMetaSupplier", "ProcessorSupplier", "MetaSupplierContext", "SupplierContext",
    "as_meta_supplier",
]


@dataclass(frozen=True)
class MetaSupplierContext:
    job_id: str
    job_name: str
    vertex_name: str
    local_parallelism: int
    total_parallelism: int
    member_count: int
    processing_guarantee: str


@dataclass(frozen=True)
class SupplierContext:
    job_id: str
    job_name: str
    vertex_name: str
    local_parallelism: int
    total_parallelism: int
    member_index: int
    member_count: int
    processing_guarantee: str
    member: Any = None
    #: the execution's key, the same on every member of one execution and new for each (a
    #: source whose members must meet outside the job, in a database, names it there)
    execution_key: str = ""


class ProcessorSupplier:
    """Creates the processors of one vertex on one member."""

    def init(self, context: SupplierContext) -> None:
        """Called once on the member before :meth:`get`."""

    def get(self, count: int) -> Sequence[Processor]:
        """Returns ``count`` new processors."""
        raise NotImplementedError

    def close(self, error: BaseException | None) -> None:
        """Called once after the job's execution on this member ended."""

    @staticmethod
    def of(factory: Callable[[], Processor]) -> "ProcessorSupplier":
        """A supplier calling ``factory()`` once per processor."""
        return _FactorySupplier(factory)


class _FactorySupplier(ProcessorSupplier):
    def __init__(self, factory: Callable[[], Processor]) -> None:
        self.factory = factory

    def get(self, count: int) -> Sequence[Processor]:
        procs = [self.factory() for _ in range(count)]
        for p in procs:
            if not isinstance(p, Processor):
                raise TypeError(
                    f"processor factory {self.factory!r} returned {type(p).__qualname__}, "
                    "not a jetwake Processor: return an instance of a Processor subclass")
        return procs


class ProcessorMetaSupplier:
    """Runs on the coordinator and gives each member its :class:`ProcessorSupplier`."""

    def preferred_local_parallelism(self) -> int:
        """-1 for the job's default; a source with one reader returns 1."""
        return -1

    def init(self, context: MetaSupplierContext) -> None:
        """Called once on the coordinator before :meth:`get`."""

    def get(self, member_indices: Sequence[int]) -> Callable[[int], ProcessorSupplier]:
        """Returns a function from member index to that member's supplier."""
        raise NotImplementedError

    @staticmethod
    def of(supplier: "ProcessorSupplier | Callable[[], Processor]",
           preferred_local_parallelism: int = -1) -> "ProcessorMetaSupplier":
        """The same supplier on every member."""
        if not isinstance(supplier, ProcessorSupplier):
            if not callable(supplier):
                raise TypeError(
                    f"expected a ProcessorSupplier or a zero-argument callable returning a "
                    f"Processor, got {type(supplier).__qualname__}")
            supplier = ProcessorSupplier.of(supplier)
        return _SameOnEveryMember(supplier, preferred_local_parallelism)


class _SameOnEveryMember(ProcessorMetaSupplier):
    def __init__(self, supplier: ProcessorSupplier, preferred: int) -> None:
        self.supplier = supplier
        self.preferred = preferred

    def preferred_local_parallelism(self) -> int:
        return self.preferred

    def get(self, member_indices: Sequence[int]) -> Callable[[int], ProcessorSupplier]:
        return lambda member_index: self.supplier


def as_meta_supplier(obj: Any, what: str) -> ProcessorMetaSupplier:
    """Accepts a meta-supplier, a supplier, a Processor subclass or a zero-arg factory."""
    if isinstance(obj, ProcessorMetaSupplier):
        return obj
    if isinstance(obj, ProcessorSupplier):
        return ProcessorMetaSupplier.of(obj)
    if isinstance(obj, Processor):
        raise TypeError(
            f"{what}: got a Processor instance; pass a factory that creates one per call "
            f"(for example the class {type(obj).__qualname__} itself, or a lambda)")
    if callable(obj):
        return ProcessorMetaSupplier.of(obj)
    raise TypeError(
        f"{what}: expected a ProcessorMetaSupplier, ProcessorSupplier or a zero-argument "
        f"callable returning a Processor, got {type(obj).__qualname__}")
