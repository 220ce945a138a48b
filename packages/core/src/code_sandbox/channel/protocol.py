"""What the in-container helpers may say, as one strict model per message.

Helpers share a uid with user code, so the host reads their output as untrusted input: every answer and every
stderr line is parsed with one of these models (exact keys, exact types, integers within 0..2^53, bounded
lengths), and anything else is a helper crash that destroys the sandbox.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from code_sandbox.limits import MAX_CODE_CHARS, MAX_FILE_BYTES, MAX_PATH_BYTES
from code_sandbox.limits import MAX_VALUE_CHARS as VALUE_CUT

PROTOCOL_VERSION = 6
"""The version of these messages and of the helpers' command lines and framing. A profile declares the version its
helpers speak, and the image carries it as the label :data:`PROTOCOL_LABEL`; both must equal this."""
PROTOCOL_LABEL = "io.code-sandbox.protocol"

MAX_SAFE_INTEGER = 2**53
"""The largest integer an IEEE 754 double represents exactly, which JSON numbers are in many runtimes; no honest
count or duration comes near it."""
MAX_B64_CHARS = (64 * 1024 * 1024 * 4) // 3 + 4
"""Base64 of the runner's largest output cap (64 MiB)."""
MAX_READ_CHARS = (MAX_FILE_BYTES + 2) // 3 * 4
"""A read's content: base64 of the largest file; a text read is held to its byte counts by the caller."""
MAX_LISTED_PATH_CHARS = 8192
"""A listed path: user code names what it makes, up to the kernel's PATH_MAX (4096 bytes), past any path the host
sends (:data:`WorkspacePath`); a listing shows it all the same."""
MAX_LIST_ENTRIES = 1000
MAX_RESULTS = 100

Count = Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER)]
WriteStatus = Literal["written", "overwritten", "exists"]
DeleteOutcome = Literal["deleted", "missing", "not_a_file"]
Base64 = Annotated[str, StringConstraints(max_length=MAX_B64_CHARS, pattern=r"^[A-Za-z0-9+/]*={0,2}$")]


class Message(BaseModel):
    """A helper message: strict types, no unknown keys, immutable."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Answer(Message):
    """An answer that went through: every one says ``ok: true``, where a :class:`Refusal` says ``false``."""

    ok: Literal[True]


# -- requests (host to helper) ------------------------------------------------------------------------------------

WorkspacePath = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PATH_BYTES)]
"""A path the host sends, checked first (:func:`code_sandbox.paths.validate_path`): no more characters than bytes."""


class WriteRequest(Message):
    """``files write``: the limits to keep; the files follow as :class:`WriteHeader` and their bytes."""

    overwrite: bool
    max_file_bytes: Count
    max_entries: Count
    max_total_bytes: Count


class WriteHeaderEntry(Message):
    path: WorkspacePath
    size: Count


class WriteHeader(Message):
    """The second frame of a write: each file's path and size, in the order their bytes follow."""

    files: Annotated[list[WriteHeaderEntry], Field(max_length=MAX_RESULTS)]


class ListRequest(Message):
    path: WorkspacePath  # "." is the workspace root
    recursive: bool
    max_depth: Count
    max_entries: Count


class ReadRequest(Message):
    path: WorkspacePath
    max_bytes: Count
    encoding: Literal["utf-8", "base64"]
    """``utf-8``: text, never cut inside a character, non-text refused; ``base64``: the first bytes as they are."""


class DeleteRequest(Message):
    paths: Annotated[list[WorkspacePath], Field(max_length=MAX_RESULTS)]


class DigestRequest(Message):
    path: WorkspacePath


class RunRequest(Message):
    """``runner -``: run ``argv`` in its own process group, with output caps and a deadline."""

    argv: Annotated[list[Annotated[str, StringConstraints(max_length=65536)]], Field(min_length=1, max_length=256)]
    timeout_ms: Annotated[int, Field(ge=1, le=86_400_000)]
    stdout_cap: Count
    stderr_cap: Count
    stream: bool


MAX_VALUE_CHARS = VALUE_CUT + 1
"""An evaluation's rendered value, as the context cut it."""


class EvaluateRequest(Message):
    """``evaluate``: run ``code`` in the sandbox's evaluation context (started first when there is none or ``reset``)
    with a run's deadline and caps; the context is paused after the call."""

    code: Annotated[str, StringConstraints(max_length=MAX_CODE_CHARS)]
    timeout_ms: Annotated[int, Field(ge=1, le=86_400_000)]
    stdout_cap: Count
    stderr_cap: Count
    reset: bool
    stream: bool


class ExecuteRequest(Message):
    """A one-shot over the channel: ``write`` (its header and bytes follow the frame), then, only if every file was
    written, ``run``."""

    write: WriteRequest
    run: RunRequest


# -- answers and lines (helper to host) ----------------------------------------------------------------------------


class Refusal(Message):
    """A helper's well-formed "no": a stable code; ``partial`` when a write stopped midway."""

    ok: Literal[False]
    code: Annotated[str, StringConstraints(max_length=64, pattern=r"^[A-Z][A-Z_]*$")]
    message: Annotated[str, StringConstraints(max_length=200)]
    partial: bool = False


class Supervised(Answer):
    """What every supervised call of user code reports: its output, time, cleanup and usage."""

    stdout_b64: Base64
    stderr_b64: Base64
    stdout_bytes: Count
    stderr_bytes: Count
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: Count
    cleanup: Literal["ok", "failed"]
    leftover_killed: Count
    cpu_ms: Count | None
    """The sandbox cgroup's CPU time over the call, in milliseconds; ``None`` where the counter cannot be read."""
    peak_memory_bytes: Count | None
    """The most memory the sandbox cgroup used during the call above what it used just before it: exact when the call
    set a new high-water mark for the cgroup; otherwise the highest of the runner's samples (every 20 ms), unless user
    code kept the runner from sampling (it stopped the runner, which then sees the SIGCONT that resumed it, or changed
    its priority, CPUs or limits), when it is the cgroup's high-water mark, which the call cannot have exceeded.
    ``None`` where the counters cannot be read."""


Ticks = Annotated[int, Field(ge=0, le=10**15)]
"""Clock ticks since boot (USER_HZ), as ``/proc/<pid>/stat`` counts a process's start."""


class RunAnswer(Supervised):
    """How a program ended, as the runner saw it."""

    exit_code: Annotated[int, Field(ge=0, le=255)] | None
    signal: Annotated[str, StringConstraints(max_length=16, pattern=r"^SIG[A-Z0-9]+$")] | None
    timed_out: bool
    oom_killed: bool
    oom_detectable: bool
    next_after: Ticks | None = None
    """A channel's run: the next run's process is started shortly after this answer; the tick it was read at, once the
    run's leftovers were gone, before which that process cannot have started (the survey spares one child of the
    channel started since, and nothing else)."""


class ThrownError(Message):
    """An error that evaluated code threw (or a promise it awaited rejected with): its stack keeps the user's frames."""

    name: Annotated[str, StringConstraints(max_length=256)]
    message: Annotated[str, StringConstraints(max_length=4096)]
    stack: Annotated[str, StringConstraints(max_length=16 * 1024)]


ContextEnd = Literal["timed_out", "OUTPUT_LIMIT_EXCEEDED", "oom_killed", "crashed"]
"""Why an evaluation context ended."""


class EvaluateAnswer(Supervised):
    """How an evaluation ended: a value or an error while the context lives on (``context_pid`` names it, paused,
    for the survey to spare), or why the context ended (``context_ended``), with a run's output and usage fields."""

    value: Annotated[str, StringConstraints(max_length=MAX_VALUE_CHARS)] | None
    error: ThrownError | None
    context_reset: bool
    context_pid: Annotated[int, Field(ge=1, le=2**32)] | None
    context_started: Ticks | None
    """The paused context's start time (clock ticks after boot): with its pid, the survey spares that process only."""
    context_ended: ContextEnd | None


class KillAllAnswer(Answer):
    """``runner --kill-all``: how many processes it killed, and whether a scan then found none."""

    killed: Count
    cleanup: Literal["ok", "failed"]


class SurveyAnswer(Answer):
    """``runner --survey``, run as the supervisor uid: live processes of any other unprivileged uid."""

    alive: Count


class ReadyAnswer(Answer):
    """``runner --watchdog-ready``: whether the watchdog has installed its claim-signal handler."""

    ready: bool


class ChannelHello(Answer):
    """``runner --channel``'s first line: its pid and the next run's waiting process, which the supervisor's survey
    then spares."""

    pid: Annotated[int, Field(ge=1, le=2**32)]
    next_after: Ticks | None = None
    """As ``RunAnswer.next_after``, for the next run's process the channel started as it opened."""


class Progress(Message):
    """A runner progress line (stderr), about once a second."""

    elapsed_ms: Count
    stdout_bytes: Count
    stderr_bytes: Count


class OutputPiece(Message):
    """A piece of a program's kept output, streamed on the runner's stderr when asked for."""

    stream: Literal["stdout", "stderr"]
    b64: Base64


class WriteAnswer(Answer):
    results: Annotated[list[WriteStatus], Field(max_length=MAX_RESULTS)]
    entries: Count
    bytes: Count


class ExecuteAnswer(Answer):
    """Both halves of an :class:`ExecuteRequest` that went through; the first refusal is answered instead."""

    written: WriteAnswer
    run: RunAnswer


class ListRow(Message):
    path: Annotated[str, StringConstraints(min_length=1, max_length=MAX_LISTED_PATH_CHARS)]
    type: Literal["file", "directory"]
    size: Count


class ListAnswer(Answer):
    entries: Annotated[list[ListRow], Field(max_length=MAX_LIST_ENTRIES)]
    truncated: bool


class ReadAnswer(Answer):
    content: Annotated[str, StringConstraints(max_length=MAX_READ_CHARS)]
    size: Count
    truncated: bool


class DeleteAnswer(Answer):
    results: Annotated[list[DeleteOutcome], Field(max_length=MAX_RESULTS)]


class DigestAnswer(Answer):
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    size: Count


MAX_SNAPSHOT_ENTRIES = 65536
"""The most entries a snapshot's header may list: past the workspace's inode limit, which bounds a real one."""
MAX_LINK_TARGET_BYTES = 4095
Mode = Annotated[int, Field(ge=0, le=0o777)]


class PackRequest(Message):
    """``files pack``: every entry of the workspace, within these limits (else ``SNAPSHOT_TOO_LARGE``)."""

    max_entries: Count
    max_total_bytes: Count


class SnapshotDirectory(Message):
    type: Literal["directory"]
    path: WorkspacePath
    mode: Mode


class SnapshotFile(Message):
    type: Literal["file"]
    path: WorkspacePath
    mode: Mode
    size: Count


class SnapshotLink(Message):
    type: Literal["symlink"]
    path: WorkspacePath
    target: Annotated[str, StringConstraints(min_length=1, max_length=MAX_LINK_TARGET_BYTES)]


SnapshotEntry = Annotated[SnapshotDirectory | SnapshotFile | SnapshotLink, Field(discriminator="type")]


class PackAnswer(Answer):
    """What ``pack`` found, sorted by path; the files' bytes follow the answer line in this order."""

    entries: Annotated[list[SnapshotEntry], Field(max_length=MAX_SNAPSHOT_ENTRIES)]
    skipped: Count
    """Special files (FIFOs, sockets), which a snapshot does not keep."""
    bytes: Count


class UnpackRequest(Message):
    """``files unpack``: an :class:`UnpackHeader` frame and the files' bytes follow, for an empty workspace."""

    max_entries: Count
    max_total_bytes: Count


class UnpackHeader(Message):
    entries: Annotated[list[SnapshotEntry], Field(max_length=MAX_SNAPSHOT_ENTRIES)]


class UnpackAnswer(Answer):
    entries: Count
    bytes: Count


class ProbeAnswer(Message):
    """What the kernel enforces, seen from inside a hardened container (the profile's probe, for ``doctor``).

    ``None`` means the probe could not read the value.
    """

    memory_max: Count | None
    pids_max: Count | None
    interfaces: Annotated[list[Annotated[str, StringConstraints(max_length=64)]], Field(max_length=64)]
    root_writable: bool
    seccomp: Annotated[int, Field(ge=0, le=2)] | None
    no_new_privs: bool | None
    cap_eff: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{1,16}$")] | None
    apparmor: Annotated[str, StringConstraints(max_length=256)] | None


M = TypeVar("M", bound=Message)


class ProtocolViolation(Exception):
    """The bytes are not the message the protocol allows here."""


def parse_message(line: bytes, model: type[M]) -> M:
    """Parse one JSON line as ``model``; any deviation raises :class:`ProtocolViolation`, never anything else."""
    try:
        return model.model_validate_json(line)
    except (ValidationError, ValueError, RecursionError, MemoryError) as exc:
        raise ProtocolViolation(model.__name__) from exc


def parse_answer(line: bytes, model: type[M]) -> M | Refusal:
    """A helper's answer line: ``model`` when ``ok`` is true, a :class:`Refusal` when it is false."""
    try:
        return parse_message(line, model)
    except ProtocolViolation:
        return parse_message(line, Refusal)
