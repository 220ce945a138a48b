"""The engine boundary: :class:`Engine`, the typed interface through which core reaches containers, and the data it
takes and returns. The Docker and Podman adapter behind it is :mod:`code_sandbox.docker_engine`; tests use an
in-memory one."""

from code_sandbox.engine.interface import (
    DEFAULT_MAX_STDERR,
    Engine,
    ExecRequest,
    ExecStream,
    LineRequest,
    NotStarted,
    OutputSink,
    StderrSink,
    WatchRequest,
)
from code_sandbox.engine.models import (
    PODMAN,
    TRUST_MODELS,
    ContainerFacts,
    DaemonFacts,
    ExecResult,
    FileEntry,
    ImageConfig,
    ImageFacts,
    RuntimeFacts,
    StoredSnapshot,
    TrustModel,
    Usage,
    normalise_arch,
)

__all__ = [
    "DEFAULT_MAX_STDERR",
    "PODMAN",
    "TRUST_MODELS",
    "ContainerFacts",
    "DaemonFacts",
    "Engine",
    "ExecRequest",
    "ExecResult",
    "ExecStream",
    "FileEntry",
    "ImageConfig",
    "ImageFacts",
    "LineRequest",
    "NotStarted",
    "OutputSink",
    "RuntimeFacts",
    "StderrSink",
    "StoredSnapshot",
    "TrustModel",
    "Usage",
    "WatchRequest",
    "normalise_arch",
]
