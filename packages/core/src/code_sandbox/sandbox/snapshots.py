"""Snapshots of a sandbox's workspace: take one (pack the workspace, keep it on the engine), make a sandbox from one
(a new sandbox, the content unpacked into its empty workspace), and fork a sandbox (both, without keeping anything).

A new sandbox is handed out only once its whole content is in place: when anything fails on the way (the content is
refused, the transfer breaks, the helper says no), it is destroyed and never named to the client. The sandbox that
was packed is left as it was, unless its helper broke the protocol.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Awaitable, Callable, Iterator
from functools import partial

import anyio

from code_sandbox.channel.guard import Channel
from code_sandbox.channel.protocol import PackRequest, Refusal, UnpackAnswer, UnpackHeader, UnpackRequest
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.limits import WORKSPACE_BYTES
from code_sandbox.sandbox.sessions import Session, SessionManager
from code_sandbox.sandbox.snapshot_content import Content, ContentError, Streamed, checked
from code_sandbox.sandbox.snapshot_store import MAX_ENTRIES, SnapshotInfo, SnapshotStore
from code_sandbox.threads import in_call_thread, in_engine_thread

MiB = 1024 * 1024
BASE_SECONDS = 30.0
BYTES_PER_SECOND = 4 * MiB
"""How long a pack or an unpack may take: :data:`BASE_SECONDS`, and a second for each this many bytes (a loaded
machine under gVisor moves a 64 MiB workspace in a few seconds)."""

_KEPT_REFUSALS: dict[str, tuple[ErrorCode, str]] = {
    "SNAPSHOT_TOO_LARGE": (ErrorCode.SNAPSHOT_LIMIT_EXCEEDED, "the workspace is larger than a snapshot may be ({})"),
    "INVALID_PATH": (
        ErrorCode.INVALID_PATH,
        "the workspace holds a name a snapshot cannot keep (not UTF-8, a control character, or past the path limits)",
    ),
    "PERMISSION_DENIED": (
        ErrorCode.PERMISSION_DENIED,
        "a program took away the sandbox's own read permission from a file; restore it and try again",
    ),
    "INVALID_REQUEST": (ErrorCode.NOT_SUPPORTED, "this profile's sandboxes cannot take snapshots"),
    "NOT_SUPPORTED": (ErrorCode.NOT_SUPPORTED, "this profile's sandboxes cannot take snapshots"),
}
"""What a pack refusal means; each leaves the sandbox as it was. Any other refusal destroys it."""


def generated_name() -> str:
    return f"snap-{secrets.token_hex(4)}"


def _seconds(size: int) -> float:
    return BASE_SECONDS + size / BYTES_PER_SECOND


async def pack(channel: Channel, *, max_bytes: int) -> Content:
    """The content of a leased sandbox's workspace, checked as hostile input.

    :raises SandboxError: a refusal of :data:`_KEPT_REFUSALS`; anything the helper should never say destroys the
        sandbox (``TRANSFER_FAILED``).
    """
    request = PackRequest(max_entries=MAX_ENTRIES, max_total_bytes=max_bytes)
    broken = SandboxError(ErrorCode.TRANSFER_FAILED, "the workspace could not be read; the sandbox was destroyed")
    hung = SandboxError(ErrorCode.TIMEOUT, "reading the workspace hung; the sandbox was destroyed")
    async with channel.guard(crashed=broken, hung=hung):
        reply = await in_call_thread(
            partial(channel.transport.pack, channel.target, request, timeout=_seconds(max_bytes))
        )
    if isinstance(reply, Refusal):
        if reply.code in _KEPT_REFUSALS and not reply.partial:
            code, message = _KEPT_REFUSALS[reply.code]
            raise SandboxError(code, message.format(f"{max_bytes // MiB} MiB"))
        raise await channel.fail_closed(broken)
    answer, body = reply
    try:
        return checked(answer.entries, body, max_entries=MAX_ENTRIES, max_bytes=max_bytes, skipped=answer.skipped)
    except ContentError:
        raise await channel.fail_closed(broken) from None


def _unpack_payload(content: Streamed) -> Iterator[bytes]:
    header = UnpackHeader(entries=list(content.entries)).model_dump_json().encode()
    yield struct.pack(">I", len(header)) + header
    yield from content.pieces


async def unpack(channel: Channel, content: Streamed) -> None:
    """Make ``content`` in a new sandbox's empty workspace, its bytes sent on as they come.

    :raises SandboxError: the content failed its checks on the way (``content.failure``), or the helper refused or
        broke (the caller destroys the sandbox).
    """
    request = UnpackRequest(max_entries=MAX_ENTRIES, max_total_bytes=WORKSPACE_BYTES)
    broken = SandboxError(ErrorCode.TRANSFER_FAILED, "the snapshot could not be written into the new sandbox")
    hung = SandboxError(ErrorCode.TIMEOUT, "writing the snapshot into the new sandbox hung")
    try:
        async with channel.guard(crashed=broken, hung=hung):
            reply = await in_call_thread(
                partial(
                    channel.transport.files, channel.target, request, UnpackAnswer, payload=_unpack_payload(content),
                    timeout=_seconds(content.size),
                )
            )  # fmt: skip
    except SandboxError:
        if content.failure is not None:
            raise content.failure from None
        raise
    whole = content.whole and content.failure is None  # every byte sent came and passed its checks
    if not whole or isinstance(reply, Refusal) or (reply.entries, reply.bytes) != (len(content.entries), content.size):
        raise content.failure or broken


async def take(
    manager: SessionManager, store: SnapshotStore, session_id: str, name: str
) -> tuple[SnapshotInfo, Content]:
    """``snapshot_sandbox``: keep the workspace of ``session_id`` as the snapshot ``name``; what was kept."""
    await in_engine_thread(store.check_room, name, 0)  # refused before anything is read (and again before it is kept)
    async with manager.channel(session_id) as channel:
        content = await pack(channel, max_bytes=store.max_bytes)
    return await in_engine_thread(store.save, name, content), content


async def restore(manager: SessionManager, store: SnapshotStore, name: str) -> tuple[Session, Streamed]:
    """``create_sandbox`` from a snapshot: the content's entries are read and checked while the sandbox is made, and
    its bytes go from the engine to the sandbox as they come."""
    info = await in_engine_thread(store.find, name)
    return await _filled(manager, lambda: in_engine_thread(store.open, info))


async def fork(manager: SessionManager, session_id: str) -> tuple[Session, Streamed]:
    """``create_sandbox`` as a copy of a sandbox's workspace, kept nowhere."""
    async with manager.channel(session_id) as channel:
        content = await pack(channel, max_bytes=WORKSPACE_BYTES)

    async def packed() -> Streamed:
        return content.streamed()

    return await _filled(manager, packed)


async def _filled(manager: SessionManager, content_of: Callable[[], Awaitable[Streamed]]) -> tuple[Session, Streamed]:
    """A new sandbox with the content ``content_of()`` gives, which runs while the sandbox is made; destroyed, and
    the first failure raised, when either fails or the content cannot be written."""
    outcome: list[Streamed | SandboxError] = []

    async def load() -> None:
        try:
            outcome.append(await content_of())
        except SandboxError as error:
            outcome.append(error)

    made: Session | None = None
    # The container is filled before the pool starts its replacement: both at once share the CPU.
    async with manager.pool.refills_held():
        try:
            failure: SandboxError | None = None
            async with anyio.create_task_group() as group:
                group.start_soon(load)
                try:
                    made = await manager.create()
                except SandboxError as error:
                    failure = error
            content = outcome[0] if outcome else SandboxError(ErrorCode.INTERNAL_ERROR, "the snapshot was not read")
            if failure is not None:
                raise failure
            if isinstance(content, SandboxError):
                raise content
            assert made is not None  # noqa: S101 - made, or failure was raised
            async with manager.channel(made.id) as channel:
                await unpack(channel, content)
        except BaseException:
            if made is not None:  # never named to the client: it goes, whatever ended it (a cancel too)
                await manager.fail_closed(made)
            raise
        finally:
            for item in outcome:
                if isinstance(item, Streamed):
                    item.close()
    return made, content
