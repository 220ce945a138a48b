"""Where snapshots are kept: on the engine, each an image of one file (:mod:`code_sandbox.docker_engine.snapshots`)
whose labels say what it is, sealed (:mod:`code_sandbox.sandbox.snapshot_seal`).

A snapshot is found by its name with one engine request (:func:`snapshot_tag`). The count and byte bounds need every
snapshot, which only a listing of every image of the engine gives (half a second on an engine with 800 images): they
are checked against a catalogue that this server keeps up to date with its own snapshots and reads again from the
engine when it is older than :data:`CATALOGUE_SECONDS`, and always before it refuses one. Images of this scope that
no name leads to any more (orphans) count against the bounds until ``reap`` removes them.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import itertools
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from code_sandbox.engine import Engine, StoredSnapshot
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import LABEL_MANAGED, LABEL_PREFIX, LABEL_PROFILE, LABEL_TAG, Hardening
from code_sandbox.sandbox.read_ahead import ReadAhead, close_iterator
from code_sandbox.sandbox.snapshot_content import (
    MAGIC,
    MAX_HEADER_BYTES,
    Content,
    ContentError,
    Streamed,
    checked_entries,
    digest,
    encode,
    header_of,
    refused,
)
from code_sandbox.sandbox.snapshot_seal import LABEL_SEAL, SnapshotKey
from code_sandbox.settings import Settings

MiB = 1024 * 1024
LABEL_SNAPSHOT = LABEL_PREFIX + "snapshot"
"""The snapshot's name; every snapshot carries it (it is what the engine is asked to list)."""
LABEL_CREATED = LABEL_SNAPSHOT + ".created"
LABEL_BYTES = LABEL_SNAPSHOT + ".bytes"
"""Its files' bytes."""
LABEL_KEPT = LABEL_SNAPSHOT + ".kept"
"""The bytes the engine keeps for it: the files' and the header's that lists them."""
LABEL_FILES = LABEL_SNAPSHOT + ".files"
LABEL_ENTRIES = LABEL_SNAPSHOT + ".entries"
LABEL_DIGEST = LABEL_SNAPSHOT + ".sha256"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
_NAME = re.compile(NAME_PATTERN)
_DIGITS = re.compile(r"[0-9]{1,15}")
_HEX = re.compile(r"[0-9a-f]{64}")
_PROFILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_ENTRIES = Hardening().inodes
"""The most entries a snapshot holds: a workspace holds no more (its tmpfs has this many inodes)."""
CATALOGUE_SECONDS = 30.0
"""How old this server's catalogue of snapshots may be when it admits a snapshot within the bounds."""
_HEADER_SLACK = len(MAGIC) + 4 + MAX_HEADER_BYTES
"""What a kept snapshot may hold besides its files' bytes: its format, and its header listing every entry."""


def is_snapshot_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def snapshot_tag(profile: str, tag: str | None, name: str) -> str:
    """The engine's tag of a snapshot: its scope (profile and operator tag) as a short hash, then its name, so that
    one engine request finds it by name."""
    scope = hashlib.sha256(f"{profile}\0{tag or ''}".encode()).hexdigest()[:12]
    return f"{scope}.{name}"


@dataclass(frozen=True)
class SnapshotInfo:
    """A kept snapshot as its labels describe it (believed only when ``sealed``)."""

    id: str
    name: str
    profile: str
    tag: str | None
    bytes: int
    kept: int
    files: int
    entries: int
    created: float
    digest: str
    sealed: bool
    """Whether the seal holds under this machine's key."""
    named: bool = True
    """Whether its name leads to it: ``False`` for an orphan, whose tag moved to a later snapshot of the same name."""


def _changed() -> SandboxError:
    return SandboxError(
        ErrorCode.SNAPSHOT_INVALID, "the snapshot's content was changed outside code-sandbox; not restored"
    )


class SnapshotStore:
    """The snapshots of one server's scope: its profile, and its tag (``CODE_SANDBOX_TAG``) or none."""

    def __init__(self, engine: Engine, settings: Settings, profile: str, state_dir: Path) -> None:
        self.engine = engine
        self.settings = settings
        self.profile = profile
        self.tag = engine.labels.get(LABEL_TAG)
        self.key = SnapshotKey(state_dir)
        self._lock = threading.Lock()
        self._saving: set[str] = set()
        """Names this server is saving now: a second save of one is refused at once, leaving no orphan."""
        self._catalogue: dict[str, SnapshotInfo] = {}
        """This scope's snapshots and orphans by ID, as last read (and changed by this server since)."""
        self._catalogued_at: float | None = None

    @property
    def max_bytes(self) -> int:
        return self.settings.snapshot_max_mib * MiB

    @property
    def max_age(self) -> float:
        return self.settings.snapshot_max_age_hours * 3600.0

    def tag_of(self, name: str) -> str:
        return snapshot_tag(self.profile, self.tag, name)

    # -- reading ----------------------------------------------------------------------------------------------

    def _all(self) -> list[SnapshotInfo]:
        """Every snapshot image on the engine whose labels can be read, named or orphaned, oldest first. Reads every
        image of the engine; refreshes the catalogue."""
        found = [info for info in map(self._info, self.engine.list_snapshots(LABEL_SNAPSHOT)) if info is not None]
        with self._lock:
            self._catalogue = {info.id: info for info in found if self._in_scope(info)}
            self._catalogued_at = time.monotonic()
        return sorted(found, key=lambda info: (info.created, info.id))

    def kept(self, *, every_scope: bool = False) -> list[SnapshotInfo]:
        """Every snapshot on the engine (of this scope unless ``every_scope``) that its name leads to, oldest
        first."""
        return [info for info in self._all() if info.named and (every_scope or self._in_scope(info))]

    def orphans(self) -> list[StoredSnapshot]:
        """Snapshot images that no name leads to: their tag moved to a later snapshot of the same name (two servers
        took it at once), was removed outside code-sandbox, or their labels cannot be read; ``reap`` removes them."""
        return [stored for stored in self.engine.list_snapshots(LABEL_SNAPSHOT) if not self._named(stored)]

    def live(self) -> list[SnapshotInfo]:
        """The snapshots of this scope a model may restore: sealed, younger than the age limit."""
        now = self.engine.now()
        return [info for info in self.kept() if info.sealed and now - info.created < self.max_age]

    def find(self, name: str) -> SnapshotInfo:
        """The snapshot ``name`` of this scope.

        :raises SandboxError: ``SNAPSHOT_NOT_FOUND`` (none, or past its age); ``SNAPSHOT_INVALID`` (its labels are
            not a snapshot's of this scope, or its seal fails).
        """
        stored = self.engine.find_snapshot(self.tag_of(name))
        if stored is None:
            raise SandboxError(ErrorCode.SNAPSHOT_NOT_FOUND, "no snapshot of that name; list_snapshots shows them")
        info = self._info(stored)
        if info is None or not info.sealed or not info.named or info.name != name or not self._in_scope(info):
            raise SandboxError(
                ErrorCode.SNAPSHOT_INVALID,
                "the snapshot was changed outside code-sandbox, or made without this machine's key; not restored",
            )
        if self.engine.now() - info.created >= self.max_age:
            raise SandboxError(ErrorCode.SNAPSHOT_NOT_FOUND, "the snapshot passed its age limit and is removed")
        return info

    def open(self, info: SnapshotInfo) -> Streamed:
        """The content of a sealed snapshot as it comes from the engine: its entries read and checked as hostile input
        (and against the labels) before this returns, its files' bytes handed on as they come, checked against the
        seal's digest and size as they end.

        :raises SandboxError: ``SNAPSHOT_INVALID``; ``SNAPSHOT_NOT_FOUND`` when it was removed meanwhile.
        """
        pieces = iter(self.engine.read_snapshot(info.id, max_bytes=info.bytes + _HEADER_SLACK))
        hasher = hashlib.sha256()
        head = bytearray()
        try:
            parsed = None
            while parsed is None:
                piece = next(pieces, None)
                if piece is None:
                    raise ContentError("it is cut short")
                hasher.update(piece)
                head += piece
                parsed = header_of(head)
            entries, start = parsed
            size = checked_entries(entries, max_entries=MAX_ENTRIES, max_bytes=self.max_bytes)
        except ContentError as error:
            close_iterator(pieces)
            raise refused(error) from None
        except BaseException:
            close_iterator(pieces)
            raise
        files = sum(1 for entry in entries if entry.type == "file")
        if (size, files, len(entries), start + size) != (info.bytes, info.files, info.entries, info.kept):
            close_iterator(pieces)
            raise SandboxError(ErrorCode.SNAPSHOT_INVALID, "the snapshot's content is not what its labels say")
        streamed = Streamed(tuple(entries), size, iter(()))
        # Read ahead from here on, by a thread that runs (and closes) the engine's answer: while the sandbox takes one
        # piece, the next ones come.
        streamed.pieces = ReadAhead(self._verified(streamed, bytes(head[start:]), pieces, hasher, info))
        return streamed

    def _verified(
        self, streamed: Streamed, first: bytes, pieces: Iterator[bytes], hasher: Any, info: SnapshotInfo
    ) -> Iterator[bytes]:
        """``first`` (hashed already) and the rest of ``pieces``, hashed as they pass; past the size, or at the end
        with a digest that is not the seal's, ``SNAPSHOT_INVALID`` (kept in ``streamed.failure``). ``streamed.whole``
        is set once the last piece is checked."""
        sent = 0
        try:
            for index, piece in enumerate(itertools.chain((first,), pieces)):
                if index:
                    hasher.update(piece)
                sent += len(piece)
                if sent > streamed.size:
                    raise _changed()
                if piece:
                    yield piece
            if sent != streamed.size or not hmac.compare_digest(hasher.hexdigest(), info.digest):
                raise _changed()
            streamed.whole = True
        except SandboxError as error:
            streamed.failure = error if error.code == ErrorCode.SNAPSHOT_INVALID else None
            raise
        finally:
            close_iterator(pieces)

    def load(self, info: SnapshotInfo) -> Content:
        """The whole content of a sealed snapshot, checked as :meth:`open` checks it."""
        streamed = self.open(info)
        try:
            body = b"".join(streamed.pieces)
        finally:
            streamed.close()
        return Content(streamed.entries, body)

    # -- writing ----------------------------------------------------------------------------------------------

    def check_room(self, name: str, kept: int) -> None:
        """Refuse a snapshot that could not be kept: its name taken, or past a bound with ``kept`` more bytes.

        :raises SandboxError: ``SNAPSHOT_EXISTS``, ``SNAPSHOT_LIMIT_EXCEEDED``.
        """
        if self.engine.find_snapshot(self.tag_of(name)) is not None:
            raise SandboxError(
                ErrorCode.SNAPSHOT_EXISTS, "a snapshot of that name exists; choose another name (list_snapshots)"
            )
        with self._lock:
            fresh = self._catalogued_at is not None and time.monotonic() - self._catalogued_at < CATALOGUE_SECONDS
            view = list(self._catalogue.values())
        if not fresh or self._refusal(view, kept) is not None:
            self._all()  # a refusal is only ever made on what the engine holds now
            with self._lock:
                view = list(self._catalogue.values())
        refusal = self._refusal(view, kept)
        if refusal is not None:
            raise refusal

    def _refusal(self, kept: list[SnapshotInfo], size: int) -> SandboxError | None:
        if len(kept) + 1 > self.settings.snapshots_max:
            return SandboxError(
                ErrorCode.SNAPSHOT_LIMIT_EXCEEDED,
                f"at most {self.settings.snapshots_max} snapshots may be kept; the operator removes them "
                "(code-sandbox snapshots rm)",
            )
        if sum(info.kept for info in kept) + size > self.settings.snapshots_max_total_mib * MiB:
            return SandboxError(
                ErrorCode.SNAPSHOT_LIMIT_EXCEEDED,
                f"the snapshots kept may hold {self.settings.snapshots_max_total_mib} MiB together; this one does "
                "not fit (the operator removes snapshots: code-sandbox snapshots rm)",
            )
        return None

    def save(self, name: str, content: Content) -> SnapshotInfo:
        """Keep ``content`` as the snapshot ``name``. The engine makes it in one step. A name this server is saving is
        refused at once; when another server took the name meanwhile, this one is removed (``SNAPSHOT_EXISTS``).

        :raises SandboxError: as :meth:`check_room`; ``SNAPSHOT_LIMIT_EXCEEDED`` for a header past its bound;
            ``NOT_SUPPORTED`` without a key.
        """
        with self._lock:
            if name in self._saving:
                raise SandboxError(ErrorCode.SNAPSHOT_EXISTS, "a snapshot of that name is being saved; choose another")
            self._saving.add(name)
        try:
            return self._save(name, content)
        finally:
            with self._lock:
                self._saving.discard(name)

    def _save(self, name: str, content: Content) -> SnapshotInfo:
        blob = encode(content)
        if len(blob) - len(content.body) > _HEADER_SLACK:
            raise SandboxError(
                ErrorCode.SNAPSHOT_LIMIT_EXCEEDED, "the workspace lists more names than a snapshot may hold"
            )
        self.check_room(name, len(blob))
        labels = {
            LABEL_MANAGED: "true",
            LABEL_SNAPSHOT: name,
            LABEL_PROFILE: self.profile,
            LABEL_CREATED: str(int(self.engine.now())),
            LABEL_BYTES: str(len(content.body)),
            LABEL_KEPT: str(len(blob)),
            LABEL_FILES: str(content.files),
            LABEL_ENTRIES: str(len(content.entries)),
            LABEL_DIGEST: digest(blob),
            **({LABEL_TAG: self.tag} if self.tag is not None else {}),
        }
        labels[LABEL_SEAL] = self.key.seal(labels)
        tag = self.tag_of(name)
        snapshot_id = self.engine.store_snapshot(blob, labels, tag)
        now_named = self.engine.find_snapshot(tag)
        if now_named is None or now_named.id != snapshot_id:
            with contextlib.suppress(SandboxError):
                self.engine.remove_snapshot(snapshot_id)
            raise SandboxError(ErrorCode.SNAPSHOT_EXISTS, "a snapshot of that name was made meanwhile; choose another")
        info = self._info(StoredSnapshot(snapshot_id, labels, (tag,)))
        assert info is not None  # noqa: S101 - labels made just above
        with self._lock:
            self._catalogue[info.id] = info
        return info

    def remove(self, info: SnapshotInfo) -> bool:
        removed = self.engine.remove_snapshot(info.id)
        with self._lock:
            self._catalogue.pop(info.id, None)
        return removed

    def remove_expired(self, *, every_scope: bool = False) -> int:
        """Remove the snapshots (of this scope unless ``every_scope``) past the age limit; how many were removed."""
        now = self.engine.now()
        removed = 0
        for info in self.kept(every_scope=every_scope):
            if now - info.created >= self.max_age:
                with contextlib.suppress(SandboxError):
                    removed += self.remove(info)
        return removed

    def _in_scope(self, info: SnapshotInfo) -> bool:
        return info.profile == self.profile and info.tag == self.tag

    def _named(self, stored: StoredSnapshot) -> bool:
        info = self._info(stored)
        return info is not None and info.named

    def _info(self, stored: StoredSnapshot) -> SnapshotInfo | None:
        """What a snapshot image's labels say, if they can be read (``named``: its tag is the one they name it by).
        Labels are anyone's with the engine: any that are not what this server writes make it unreadable, never an
        error."""
        labels = stored.labels
        keys = (LABEL_CREATED, LABEL_BYTES, LABEL_KEPT, LABEL_FILES, LABEL_ENTRIES)
        numbers = [labels.get(key, "") for key in keys]
        name, profile, tag = labels.get(LABEL_SNAPSHOT, ""), labels.get(LABEL_PROFILE, ""), labels.get(LABEL_TAG)
        texts = [name, profile, tag or "x", *numbers, labels.get(LABEL_DIGEST, "")]
        if not all(text.isascii() for text in texts):
            return None
        if not (is_snapshot_name(name) and _PROFILE.fullmatch(profile) and all(_DIGITS.fullmatch(n) for n in numbers)):
            return None
        if _HEX.fullmatch(labels.get(LABEL_DIGEST, "")) is None:
            return None
        created, size, kept, files, entries = (int(n) for n in numbers)
        return SnapshotInfo(
            id=stored.id,
            name=name,
            profile=profile,
            tag=tag,
            bytes=size,
            kept=kept,
            files=files,
            entries=entries,
            created=float(created),
            digest=labels[LABEL_DIGEST],
            sealed=self.key.holds(labels),
            named=snapshot_tag(profile, tag, name) in stored.tags,
        )
