"""Reading what an image build and a filesystem export stream back."""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Callable, Iterable, Iterator
from typing import IO

from code_sandbox.docker_engine.answers import BuildEvent
from code_sandbox.engine import FileEntry
from code_sandbox.errors import ErrorCode, SandboxError


def follow_build(events: Iterable[object], on_step: Callable[[str], None]) -> str | None:
    """Read a build's decoded progress events to their end; the image ID when the builder said it.

    :raises SandboxError: ``IMAGE_BUILD_FAILED`` with the builder's words as ``engine_text``.
    """
    image_id: str | None = None
    failure: str | None = None
    for raw in events:
        if failure is not None:
            continue  # read to the end, which comes right after an error: the connection is then released
        event = BuildEvent.model_validate(raw)
        if event.failure is not None:
            failure = event.failure
            continue
        stream = (event.stream or "").strip()
        if stream.startswith("Step "):
            on_step(stream.split(" :", 1)[0])
        image_id = event.image_id or image_id
    if failure is not None:
        raise SandboxError(
            ErrorCode.IMAGE_BUILD_FAILED, "the Docker engine could not build the image", engine_text=failure
        )
    return image_id


def read_export(chunks: Iterator[bytes]) -> Iterator[FileEntry]:
    """The entries of an exported filesystem's tar stream, every regular file hashed."""
    with tarfile.open(fileobj=ChunkReader(chunks), mode="r|") as archive:
        for member in archive:
            digest: str | None = None
            if member.isfile():
                extracted = archive.extractfile(member)
                if extracted is not None:
                    digest = _sha256_of(extracted)
            yield FileEntry(
                "/" + member.name.removeprefix("./").lstrip("/"),
                _kind(member),
                member.mode & 0o7777,
                member.uid,
                digest,
                member.gid,
                member.linkname,
            )


def _kind(member: tarfile.TarInfo) -> str:
    if member.isfile():
        return "file"
    if member.isdir():
        return "directory"
    if member.issym() or member.islnk():
        return "symlink"
    return "other"


class ChunkReader(io.RawIOBase):
    """A read-only file object over an iterator of byte chunks (the export stream)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # pyright: ignore[reportIncompatibleMethodOverride]
        target = memoryview(buffer).cast("B")
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(target), len(self._buffer))
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size


def _sha256_of(stream: IO[bytes]) -> str:
    digest = hashlib.sha256()
    while chunk := stream.read(1 << 20):
        digest.update(chunk)
    return digest.hexdigest()
