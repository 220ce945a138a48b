"""The workspace file tools: write, list, read, delete.

Bytes go from memory over the exec's stdin to the file helper; nothing touches the host filesystem. Every limit
is checked before anything is written, so a refused write leaves the session and its files as they were. A
broken transfer or an integrity violation (a symlink, hard link or special file that only user code can make)
destroys the session: it fails closed.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal

from code_sandbox.channel.guard import Channel, Sandboxes
from code_sandbox.channel.protocol import (
    DeleteAnswer,
    DeleteOutcome,
    DeleteRequest,
    ListAnswer,
    ListRequest,
    M,
    ReadAnswer,
    ReadRequest,
    Refusal,
    WriteAnswer,
    WriteHeader,
    WriteHeaderEntry,
    WriteRequest,
    WriteStatus,
)
from code_sandbox.channel.transport import FileRequest
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.limits import (
    MAX_ENTRIES,
    MAX_FILE_BYTES,
    MAX_FILES_PER_CALL,
    MAX_LIST_DEPTH,
    MAX_LIST_ENTRIES,
    MAX_REQUEST_BYTES,
    WORDS,
    WORKSPACE_BYTES,
)
from code_sandbox.paths import validate_path
from code_sandbox.sandbox.answer_text import CONTENT_JSON_BYTES, LISTING_JSON_BYTES, json_cost, readable, within
from code_sandbox.sandbox.pictures import whole_picture_type
from code_sandbox.sandbox.results import ReadFileOutput
from code_sandbox.threads import in_call_thread

HELPER_TIMEOUT_SECONDS = 30.0
"""A picture read as base64 up to this size is also returned as an image for the client to show."""


# Refusals the helper reports; anything else it says ends the session.
_REFUSALS: dict[str, tuple[ErrorCode, str]] = {
    "INVALID_PATH": (ErrorCode.INVALID_PATH, "a path is not valid for this operation"),
    "PATH_TRAVERSAL": (ErrorCode.PATH_TRAVERSAL, "the path tries to leave the workspace"),
    "FILE_TOO_LARGE": (ErrorCode.FILE_TOO_LARGE, f"a file is larger than {WORDS['file_max']}"),
    "WORKSPACE_LIMIT_EXCEEDED": (
        ErrorCode.WORKSPACE_LIMIT_EXCEEDED,
        f"the write would exceed the workspace limits ({WORDS['entries']} files and directories, "
        f"{WORDS['workspace']}); nothing was written",
    ),
    "NOT_FOUND": (ErrorCode.NOT_FOUND, "no such file or directory in the workspace"),
    "NOT_A_DIRECTORY": (ErrorCode.INVALID_PATH, "the path is not a directory"),
    "NOT_A_FILE": (ErrorCode.INVALID_PATH, "the path is not a regular file"),
    "BINARY_FILE": (ErrorCode.BINARY_FILE, "the file is not UTF-8 text (it has invalid UTF-8 or NUL bytes)"),
    "PERMISSION_DENIED": (ErrorCode.PERMISSION_DENIED, "the program changed the permissions of a file or directory"),
}


# What the helper reports when it could not finish safely; each destroys the session.
_FAILURES: dict[str, tuple[ErrorCode, str]] = {
    "WORKSPACE_INTEGRITY": (
        ErrorCode.WORKSPACE_INTEGRITY,
        "the workspace holds a symbolic link, hard link or special file (made by the program), "
        "or changed during the operation",
    ),
    "TRANSFER_FAILED": (ErrorCode.TRANSFER_FAILED, "the file transfer broke off midway"),
    "WORKSPACE_LIMIT_EXCEEDED": (ErrorCode.WORKSPACE_LIMIT_EXCEEDED, "the workspace filled up midway through a write"),
    "PERMISSION_DENIED": (
        ErrorCode.PERMISSION_DENIED,
        "a change was refused midway by permissions the program set, after part of it was made",
    ),
}


@dataclass(frozen=True)
class ListEntry:
    path: str
    type: Literal["file", "directory"]
    size: int


def encode_write_stream(files: Sequence[tuple[str, bytes]]) -> Iterator[bytes]:
    """A write's payload after its request frame: a 4-byte big-endian header length, the JSON header
    (:class:`WriteHeader`), then the files' bytes in order."""
    header = WriteHeader(files=[WriteHeaderEntry(path=path, size=len(data)) for path, data in files])
    body = header.model_dump_json().encode()
    yield struct.pack(">I", len(body)) + body
    for _path, data in files:
        yield data


@dataclass(frozen=True)
class PreparedWrite:
    """A checked write: its request, and the files' paths and bytes (:func:`prepare_write`)."""

    request: WriteRequest
    files: list[tuple[str, bytes]]

    def payload(self) -> Iterator[bytes]:
        return encode_write_stream(self.files)

    @property
    def seconds(self) -> float:
        """How long sending and writing these files may take: generous for a loaded machine, and no longer, since
        a one-shot's run deadline includes it."""
        return 5.0 + sum(len(data) for _path, data in self.files) / (512 * 1024)


def prepare_write(files: Sequence[tuple[str, str | bytes]], *, overwrite: bool) -> PreparedWrite:
    """Check a write against every limit before anything is sent: paths, duplicates, encoding, sizes."""
    if not 1 <= len(files) <= MAX_FILES_PER_CALL:
        raise SandboxError(ErrorCode.INVALID_REQUEST, f"write between 1 and {MAX_FILES_PER_CALL} files per call")
    encoded: list[tuple[str, bytes]] = []
    seen: set[str] = set()
    for raw_path, content in files:
        path = validate_path(raw_path)
        if path in seen:
            raise SandboxError(ErrorCode.INVALID_PATH, "the same path appears twice in one request")
        seen.add(path)
        try:
            data = content if isinstance(content, bytes) else content.encode("utf-8")
        except UnicodeEncodeError:
            raise SandboxError(ErrorCode.INVALID_REQUEST, "file content must be valid Unicode text") from None
        if len(data) > MAX_FILE_BYTES:
            raise SandboxError(ErrorCode.FILE_TOO_LARGE, f"a file is larger than {WORDS['file_max']}")
        encoded.append((path, data))
    if sum(len(data) for _path, data in encoded) > MAX_REQUEST_BYTES:
        raise SandboxError(ErrorCode.FILE_TOO_LARGE, f"one request may carry at most {WORDS['request_max']}")
    request = WriteRequest(
        overwrite=overwrite,
        max_file_bytes=MAX_FILE_BYTES,
        max_entries=MAX_ENTRIES,
        max_total_bytes=WORKSPACE_BYTES,
    )
    return PreparedWrite(request, encoded)


async def write_files(
    sandboxes: Sandboxes, session_id: str, files: Sequence[tuple[str, str | bytes]], *, overwrite: bool
) -> list[WriteStatus]:
    """Write files (text, written as UTF-8, or bytes) into the workspace; per-path status in request order."""
    write = prepare_write(files, overwrite=overwrite)
    async with sandboxes.channel(session_id) as channel:
        answer = await call_file_helper(
            channel, write.request, WriteAnswer, payload=write.payload(), results=len(write.files)
        )
    return list(answer.results)


async def list_files(
    sandboxes: Sandboxes, session_id: str, path: str, *, recursive: bool, max_depth: int
) -> tuple[list[ListEntry], bool]:
    """List a workspace directory: entries sorted by path, and whether the list was cut."""
    if not 0 <= max_depth <= MAX_LIST_DEPTH:
        raise SandboxError(ErrorCode.INVALID_REQUEST, f"max_depth must be from 0 to {MAX_LIST_DEPTH}")
    request = ListRequest(
        path=validate_path(path, allow_root=True),
        recursive=recursive,
        max_depth=max_depth,
        max_entries=MAX_LIST_ENTRIES,
    )
    async with sandboxes.channel(session_id) as channel:
        answer = await call_file_helper(channel, request, ListAnswer)
    entries = [ListEntry(row.path, row.type, row.size) for row in answer.entries]
    return _listing_within_budget(entries, answer.truncated)


_ENTRY_JSON_BYTES = len('{"path":"","type":"directory","size":9007199254740991},')


def _listing_within_budget(entries: list[ListEntry], truncated: bool) -> tuple[list[ListEntry], bool]:
    """The entries, if their JSON fits the listing's share of the answer (:data:`LISTING_JSON_BYTES`). Else their paths
    as :func:`readable` shows them (a program may name files with control characters, which no tool takes in a path
    anyway), and as many as fit."""
    if sum(json_cost(entry.path) + _ENTRY_JSON_BYTES for entry in entries) <= LISTING_JSON_BYTES:
        return entries, truncated
    spent = 0
    shown: list[ListEntry] = []
    for entry in entries:
        path = readable(entry.path)
        spent += json_cost(path) + _ENTRY_JSON_BYTES
        if spent > LISTING_JSON_BYTES:
            return shown, True
        shown.append(ListEntry(path, entry.type, entry.size))
    return shown, truncated


async def read_file(
    sandboxes: Sandboxes,
    session_id: str,
    path: str,
    *,
    max_bytes: int,
    encoding: Literal["utf-8", "base64"] = "utf-8",
) -> ReadFileOutput:
    """Read at most ``max_bytes`` bytes of a file: as UTF-8 text, never cutting a character (``BINARY_FILE`` for
    anything else), or as base64 of the bytes as they are."""
    if not 1 <= max_bytes <= MAX_FILE_BYTES:
        raise SandboxError(ErrorCode.INVALID_REQUEST, f"max_bytes must be from 1 to {MAX_FILE_BYTES}")
    request = ReadRequest(path=validate_path(path), max_bytes=max_bytes, encoding=encoding)
    async with sandboxes.channel(session_id) as channel:
        answer = await call_file_helper(channel, request, ReadAnswer)
        data = _read_bytes(answer, max_bytes) if encoding == "base64" else _read_text(answer, max_bytes)
        if data is None:
            raise await channel.fail_closed(_out_of_protocol())
    picture = whole_picture_type(data if encoding == "base64" else None, truncated=answer.truncated)
    content, cut = (answer.content, False) if encoding == "base64" else within(answer.content, CONTENT_JSON_BYTES)
    return ReadFileOutput(content=content, size=answer.size, truncated=answer.truncated or cut, image_type=picture)


def _read_text(answer: ReadAnswer, max_bytes: int) -> bytes | None:
    """A text read's bytes, if they are what was asked for: the whole file, or its first ``max_bytes`` bytes less
    at most the 3 bytes of a character that the cut would have split."""
    data = answer.content.encode("utf-8", "surrogatepass")
    whole = not answer.truncated and len(data) == answer.size <= max_bytes
    cut = answer.truncated and max_bytes - 3 <= len(data) <= max_bytes < answer.size
    return data if whole or cut else None


def _read_bytes(answer: ReadAnswer, max_bytes: int) -> bytes | None:
    """A base64 read's bytes, if they are what was asked for: the whole file, or its first ``max_bytes`` bytes."""
    try:
        data = base64.b64decode(answer.content, validate=True)
    except (binascii.Error, ValueError):
        return None
    whole = not answer.truncated and len(data) == answer.size <= max_bytes
    cut = answer.truncated and len(data) == max_bytes < answer.size
    return data if whole or cut else None


async def delete_files(sandboxes: Sandboxes, session_id: str, paths: Sequence[str]) -> list[DeleteOutcome]:
    """Delete regular files; a missing file is reported for its path without failing the call."""
    if not 1 <= len(paths) <= MAX_FILES_PER_CALL:
        raise SandboxError(ErrorCode.INVALID_REQUEST, f"delete between 1 and {MAX_FILES_PER_CALL} paths per call")
    request = DeleteRequest(paths=[validate_path(p) for p in paths])
    async with sandboxes.channel(session_id) as channel:
        answer = await call_file_helper(channel, request, DeleteAnswer, results=len(paths))
    return list(answer.results)


async def call_file_helper(
    channel: Channel,
    request: FileRequest,
    answer: type[M],
    *,
    payload: Iterable[bytes] = (),
    results: int | None = None,
) -> M:
    """One file-helper call on a leased sandbox; refusals raise, anything untrustworthy destroys the session.

    :param results: how many per-path results the answer must carry (one per path of the request).
    """
    transfer_failed = SandboxError(
        ErrorCode.TRANSFER_FAILED, "the file transfer failed midway; the sandbox was destroyed"
    )
    hung = SandboxError(ErrorCode.TIMEOUT, "the file operation hung; the sandbox was destroyed")
    async with channel.guard(crashed=transfer_failed, hung=hung):
        reply = await in_call_thread(
            partial(
                channel.transport.files, channel.target, request, answer, payload=payload,
                timeout=HELPER_TIMEOUT_SECONDS,
            )
        )  # fmt: skip
    return await check_file_reply(channel, reply, results)


async def check_file_reply(channel: Channel, reply: M | Refusal, results: int | None) -> M:
    """A file helper's answer, believed only if it has ``results`` per-path results; a refusal raises its error, and
    anything untrustworthy destroys the session."""
    if not isinstance(reply, Refusal):
        if results is not None and len(getattr(reply, "results", ())) != results:
            raise await channel.fail_closed(_out_of_protocol())
        return reply
    if reply.code in _REFUSALS and not reply.partial:
        error_code, message = _REFUSALS[reply.code]
        raise SandboxError(error_code, message)
    raise await channel.fail_closed(file_refusal_error(reply))


def _out_of_protocol() -> SandboxError:
    message = "the file helper answered out of protocol; the sandbox was destroyed"
    return SandboxError(ErrorCode.TRANSFER_FAILED, message)


def file_refusal_error(reply: Refusal) -> SandboxError:
    """The error for a file helper's refusal, when the sandbox is destroyed for it."""
    if reply.code in _REFUSALS and not reply.partial:
        error_code, message = _REFUSALS[reply.code]
    else:
        error_code, message = _FAILURES.get(reply.code, (ErrorCode.INTERNAL_ERROR, "the file helper failed"))
    return SandboxError(error_code, f"{message}; the sandbox was destroyed")


def is_file_refusal(reply: Refusal) -> bool:
    """Whether a refusal is one the file helper gives (as opposed to the runner's)."""
    return reply.code in _REFUSALS or reply.code in _FAILURES
