"""A snapshot's content: the entries of a workspace and its files' bytes, as the file helper packs them, checked as
hostile input, and as the engine keeps them (one opaque file, :func:`encode`).

Whatever comes from a sandbox (a pack) or from the engine (a kept snapshot, which anyone with the engine could have
replaced) passes :func:`checked` before it is believed: every name, type, mode, size and count.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from code_sandbox.channel.protocol import SnapshotDirectory, SnapshotEntry, SnapshotFile, UnpackHeader
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.limits import MAX_PATH_BYTES, MAX_PATH_DEPTH
from code_sandbox.sandbox.read_ahead import close_iterator

MAGIC = b"code-sandbox snapshot 1\n"
"""The first bytes of a kept snapshot: its format and version."""
MAX_COMPONENT_BYTES = 255
MAX_HEADER_BYTES = 8 * 1024 * 1024
"""The most a kept snapshot's header (the listing of its entries) may take: an honest workspace's 8192 entries with
paths of 1024 bytes and link targets of 4095 take less than that."""
_HEADER_LENGTH = struct.Struct(">I")


class ContentError(ValueError):
    """The content is not a workspace a snapshot may hold; the message says what, never which name."""


@dataclass(frozen=True)
class Content:
    """A workspace: its entries sorted by path, each directory before what it holds, and its files' bytes in the
    entries' order."""

    entries: tuple[SnapshotEntry, ...]
    body: bytes
    skipped: int = 0
    """Special files the pack found and left out."""

    @property
    def files(self) -> int:
        return sum(1 for entry in self.entries if isinstance(entry, SnapshotFile))

    def streamed(self) -> Streamed:
        """This content as :class:`Streamed` (all of it here, and checked already)."""
        streamed = Streamed(self.entries, len(self.body), iter(()))

        def pieces() -> Iterator[bytes]:
            yield self.body
            streamed.whole = True

        streamed.pieces = pieces()
        return streamed


@dataclass
class Streamed:
    """A workspace whose entries are checked and whose files' bytes (``size`` of them) are still on their way: the
    pieces are believed only once their iterator has ended without an error. ``failure`` is what ended it otherwise,
    for a caller whose transport turned it into a broken transfer."""

    entries: tuple[SnapshotEntry, ...]
    size: int
    pieces: Iterator[bytes]
    failure: SandboxError | None = None
    whole: bool = False
    """Set once every piece has come and passed its checks: nothing short of that is believed (by the thread that
    took the last piece: whatever sets it does so before that piece's iterator ends)."""

    def close(self) -> None:
        """Stop the pieces (and what they read from) whether or not they started."""
        close_iterator(self.pieces)


def keepable_path(path: str) -> bool:
    """Whether a snapshot may hold ``path``: the file helper's own rule for a workspace path (relative, no empty,
    ``.`` or ``..`` component, no control character or backslash, not starting with ``-``, within the path limits).
    Stricter rules of the tools (no ``:``, no device names) are for names a model sends: a program may make any name
    the helper can reach, and a snapshot keeps it."""
    parts = path.split("/")
    return (
        0 < len(path.encode("utf-8", "surrogatepass")) <= MAX_PATH_BYTES
        and len(parts) <= MAX_PATH_DEPTH
        and not path.startswith(("/", "-"))
        and "\\" not in path
        and not any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in path)
        and all(part not in ("", ".", "..") and len(part.encode()) <= MAX_COMPONENT_BYTES for part in parts)
        and all(not 0xD800 <= ord(ch) <= 0xDFFF for ch in path)
    )


def checked(
    entries: Sequence[SnapshotEntry], body: bytes, *, max_entries: int, max_bytes: int, skipped: int = 0
) -> Content:
    """``entries`` and ``body`` as a :class:`Content`, if they are one (:func:`checked_entries`), and the files' sizes
    add up to exactly ``body``.

    :raises ContentError: anything else.
    """
    if checked_entries(entries, max_entries=max_entries, max_bytes=max_bytes) != len(body):
        raise ContentError("its files' sizes do not add up to its bytes")
    return Content(tuple(entries), body, skipped)


def checked_entries(entries: Sequence[SnapshotEntry], *, max_entries: int, max_bytes: int) -> int:
    """How many bytes ``entries``' files hold, if they are a workspace's: names the helper may make, each once, sorted,
    every parent a directory listed before it, at most ``max_entries`` entries and ``max_bytes`` bytes.

    :raises ContentError: anything else.
    """
    if len(entries) > max_entries:
        raise ContentError("it has more entries than a workspace may hold")
    directories: set[str] = {""}
    previous: bytes | None = None
    total = 0
    for entry in entries:
        if not keepable_path(entry.path):
            raise ContentError("it holds a name the workspace cannot hold")
        key = entry.path.encode()
        if previous is not None and key <= previous:
            raise ContentError("its entries are not sorted, or one appears twice")
        previous = key
        if entry.path.rpartition("/")[0] not in directories:
            raise ContentError("an entry's directory is not listed before it")
        if isinstance(entry, SnapshotDirectory):
            directories.add(entry.path)
        elif isinstance(entry, SnapshotFile):
            total += entry.size
        elif "\x00" in entry.target or len(entry.target.encode("utf-8", "surrogatepass")) > 4095:
            raise ContentError("a link's target is not one the kernel takes")
    if total > max_bytes:
        raise ContentError("its files hold more than a snapshot may")
    return total


def encode(content: Content) -> bytes:
    """The one file the engine keeps: :data:`MAGIC`, the header's length (4 bytes, big-endian), the header
    (:class:`UnpackHeader` as JSON), then the files' bytes."""
    header = UnpackHeader(entries=list(content.entries)).model_dump_json().encode()
    return MAGIC + _HEADER_LENGTH.pack(len(header)) + header + content.body


def header_of(head: bytes | bytearray) -> tuple[list[SnapshotEntry], int] | None:
    """The entries a kept snapshot's first bytes list, and where its files' bytes begin; ``None`` while ``head`` is too
    short to tell. Not yet checked (:func:`checked_entries`).

    :raises ContentError: the bytes are not such a file.
    """
    start = len(MAGIC) + _HEADER_LENGTH.size
    if head[: len(MAGIC)] != MAGIC[: len(head)]:
        raise ContentError("it is not a snapshot of this format")
    if len(head) < start:
        return None
    (length,) = _HEADER_LENGTH.unpack_from(head, len(MAGIC))
    if length > MAX_HEADER_BYTES:
        raise ContentError("its header is too long")
    if len(head) < start + length:
        return None
    try:
        header = UnpackHeader.model_validate_json(bytes(head[start : start + length]))
    except (ValidationError, ValueError, RecursionError):
        raise ContentError("its header is not a snapshot's") from None
    return header.entries, start + length


def decode(blob: bytes, *, max_entries: int, max_bytes: int) -> Content:
    """A kept snapshot's content, checked as :func:`checked` checks a pack.

    :raises ContentError: the bytes are not such a file.
    """
    parsed = header_of(blob)
    if parsed is None:
        raise ContentError("its header is cut short")
    entries, start = parsed
    return checked(entries, blob[start:], max_entries=max_entries, max_bytes=max_bytes)


def digest(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def refused(error: ContentError) -> SandboxError:
    """The error a model sees for content that is not a snapshot's."""
    return SandboxError(ErrorCode.SNAPSHOT_INVALID, f"the snapshot's content is refused: {error}")
