"""Snapshots as the engine keeps them: each an image of one layer holding one file (``snapshot``), tagged in a
repository of its own (:data:`REPOSITORY`) with the tag core names it by, its labels in its configuration.

Docker imports the layer (``docker import``, the labels as its changes); Podman loads an archive of the image built
here (``docker load``), because its import leaves the whole upload behind in its temporary directory (Podman 4.3;
its load removes its copy). Either is one request, streamed, in which the engine makes the image whole, labels and all,
or makes nothing. The engine never lays out a sandbox's names, links or modes on its host's disk: the one file it
keeps is our bytes, which only core reads.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Generator, Iterable, Iterator, Mapping
from typing import IO, cast

from pydantic import BaseModel, ConfigDict, ValidationError

from code_sandbox.docker_engine.failures import APIError, NotFound, translate
from code_sandbox.docker_engine.images import ChunkReader
from code_sandbox.docker_engine.sdk import Client
from code_sandbox.engine import StoredSnapshot
from code_sandbox.errors import ErrorCode, SandboxError

REPOSITORY = "code-sandbox-snapshot"
SNAPSHOT_FILE = "snapshot"
_OUTER_SLACK = 4 * 1024 * 1024
"""What an image's saved form adds to its one layer: manifest, config, layer headers."""
_UNAVAILABLE = (ErrorCode.CONTAINER_UNAVAILABLE, "the Docker engine could not reach its snapshots")
_INVALID = SandboxError(ErrorCode.SNAPSHOT_INVALID, "the snapshot is not as code-sandbox made it; it was not restored")


class _ImageRow(BaseModel):
    model_config = ConfigDict(extra="ignore")

    Id: str
    Labels: dict[str, str] | None = None
    RepoTags: list[str] | None = None

    def stored(self) -> StoredSnapshot:
        return StoredSnapshot(self.Id, dict(self.Labels or {}), _our_tags(self.RepoTags or []))


def _our_tags(references: Iterable[str]) -> tuple[str, ...]:
    """The tags of :data:`REPOSITORY` among image references, however the engine spells the repository (Podman
    prefixes ``localhost/`` or ``docker.io/library/``)."""
    tags: list[str] = []
    for reference in references:
        repository, _, tag = reference.rpartition(":")
        if repository.rpartition("/")[2] == REPOSITORY and tag:
            tags.append(tag)
    return tuple(tags)


class _Config(BaseModel):
    model_config = ConfigDict(extra="ignore")

    Labels: dict[str, str] | None = None


class _Inspected(BaseModel):
    model_config = ConfigDict(extra="ignore")

    Id: str
    RepoTags: list[str] | None = None
    Config: _Config | None = None


class _ManifestEntry(BaseModel):
    model_config = ConfigDict(extra="ignore")

    Layers: list[str]


_GO_ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}
"""The engine's architecture (as the kernel names it) as an image's configuration names it."""
_BLOCK = 512
_END = bytes(2 * _BLOCK)


def _header(name: str, size: int) -> bytes:
    """A tar header for a regular file of ``size`` bytes: root's, read-only, dated the epoch."""
    header = tarfile.TarInfo(name)
    header.size = size
    header.mode = 0o400
    return header.tobuf(format=tarfile.PAX_FORMAT)


def _padding(size: int) -> bytes:
    return bytes(-size % _BLOCK)


def _layer(blob: bytes) -> list[bytes]:
    """The layer, a tar of the one file :data:`SNAPSHOT_FILE` holding ``blob``, in pieces (``blob`` is not copied)."""
    return [_header(SNAPSHOT_FILE, len(blob)), blob, _padding(len(blob)), _END]


def image_archive(blob: bytes, labels: Mapping[str, str], tag: str, *, architecture: str) -> tuple[str, list[bytes]]:
    """The image ID and, in pieces, a ``docker save`` archive of an image of one layer holding ``blob``, with
    ``labels``, tagged ``tag`` in :data:`REPOSITORY`, for ``architecture`` (as Go names it: ``amd64``)."""
    layer = _layer(blob)
    layer_digest = hashlib.sha256()
    for piece in layer:
        layer_digest.update(piece)
    config = json.dumps(
        {
            "architecture": architecture,
            "os": "linux",
            "config": {"Labels": dict(labels)},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest.hexdigest()}"]},
        },
        sort_keys=True,
    ).encode()
    image = hashlib.sha256(config).hexdigest()
    layer_name = f"{layer_digest.hexdigest()}/layer.tar"
    manifest = json.dumps(
        [{"Config": f"{image}.json", "RepoTags": [f"{REPOSITORY}:{tag}"], "Layers": [layer_name]}]
    ).encode()
    layer_size = sum(len(piece) for piece in layer)
    pieces = [_header(f"{image}.json", len(config)), config, _padding(len(config))]
    pieces += [_header(layer_name, layer_size), *layer, _padding(layer_size)]
    pieces += [_header("manifest.json", len(manifest)), manifest, _padding(len(manifest)), _END]
    return f"sha256:{image}", pieces


def store(api: Client, blob: bytes, labels: Mapping[str, str], tag: str, *, podman: bool, architecture: str) -> str:
    """Make ``blob`` a new image tagged ``tag`` with ``labels``; its ID. A tag in use moves to the new image. An
    engine that did not keep what it was given (a label dropped) gets the image removed and ``NOT_SUPPORTED``."""
    expected: str | None = None
    with translate(ErrorCode.SNAPSHOT_LIMIT_EXCEEDED, "the Docker engine could not keep the snapshot"):
        if podman:
            expected, pieces = image_archive(
                blob, labels, tag, architecture=_GO_ARCHITECTURES.get(architecture, architecture)
            )
            said = api.load_image(iter(pieces))
        else:
            changes = [f"LABEL {json.dumps(key)}={json.dumps(value)}" for key, value in labels.items()]
            said = api.import_image_from_data(iter(_layer(blob)), repository=f"{REPOSITORY}:{tag}", changes=changes)
        if _failed(said):
            raise SandboxError(ErrorCode.SNAPSHOT_LIMIT_EXCEEDED, "the Docker engine could not keep the snapshot")
    found = find(api, tag)
    if found is None or any(found.labels.get(k) != v for k, v in labels.items()) or expected not in (None, found.id):
        if found is not None:
            remove(api, found.id)
        raise SandboxError(ErrorCode.NOT_SUPPORTED, "the Docker engine did not keep the snapshot as it was given")
    return found.id


def _failed(said: object) -> bool:
    """Whether an import's answer (JSON lines) or a load's (decoded events) reports an error."""
    if isinstance(said, bytes | str):
        text = said.decode("utf-8", "replace") if isinstance(said, bytes) else said
        events: list[object] = []
        for line in text.splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                return True
    else:
        events = list(cast(Iterable[object], said or ()))
    return any(not isinstance(event, dict) or "error" in event or "errorDetail" in event for event in events)


PIECE = 1024 * 1024
MAX_MANIFEST_BYTES = 1024 * 1024


def read(api: Client, snapshot_id: str, *, max_bytes: int) -> Iterator[bytes]:
    """The one file of a kept snapshot, in pieces as the engine sends the image's saved form: its one layer is the
    member that is a tar of :data:`SNAPSHOT_FILE` alone, and the manifest, which comes after it in Docker's order,
    must name that member as the image's one layer. Anything else raises ``SNAPSHOT_INVALID``, possibly after pieces
    were handed on: the caller believes them only once the iterator has ended.

    :raises SandboxError: ``SNAPSHOT_NOT_FOUND`` (at once), ``SNAPSHOT_INVALID``, ``CONTAINER_UNAVAILABLE``.
    """
    with translate(*_UNAVAILABLE):
        try:
            chunks = api.get_image(snapshot_id)
        except NotFound:
            raise SandboxError(ErrorCode.SNAPSHOT_NOT_FOUND, "no snapshot of that name exists") from None
    return _pieces(chunks, max_bytes)


def _pieces(chunks: Iterator[bytes], max_bytes: int) -> Iterator[bytes]:
    layer: str | None = None
    manifest: bytes | None = None
    try:
        reader = ChunkReader(_bounded(chunks, max_bytes + _OUTER_SLACK))
        with translate(*_UNAVAILABLE), tarfile.open(fileobj=reader, mode="r|") as outer:
            for member in outer:
                if not member.isfile():
                    continue
                if member.name == "manifest.json" and member.size <= MAX_MANIFEST_BYTES:
                    manifest = _extracted(outer, member).read()
                elif layer is None and member.size <= max_bytes + _OUTER_SLACK:
                    found = yield from _layer_pieces(_extracted(outer, member), max_bytes)
                    layer = member.name if found else None
    except (tarfile.TarError, ValueError, OSError, EOFError):
        raise _INVALID from None
    finally:
        close = getattr(chunks, "close", None)
        if callable(close):
            close()
    if layer is None or manifest is None:
        raise _INVALID
    try:
        entries = [_ManifestEntry.model_validate(entry) for entry in json.loads(manifest)]
    except (ValidationError, ValueError, TypeError, RecursionError):
        raise _INVALID from None
    if len(entries) != 1 or entries[0].Layers != [layer]:
        raise _INVALID


def _bounded(chunks: Iterator[bytes], limit: int) -> Iterator[bytes]:
    """``chunks``, until more than ``limit`` bytes came: the saved form of an image of one file of known size is
    bounded, and a larger one is not a snapshot's."""
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise _INVALID
        yield chunk


def _layer_pieces(member: IO[bytes], max_bytes: int) -> Generator[bytes, None, bool]:
    """The file of a layer that is a tar of :data:`SNAPSHOT_FILE` alone, in pieces; ``False`` (and nothing handed on)
    when the member is not such a tar: the configuration, another file of the saved form."""
    try:
        inner = tarfile.open(fileobj=member, mode="r|")  # noqa: SIM115 - closed below, past the yields
    except tarfile.TarError:
        return False
    with inner:
        try:
            first = inner.next()
        except tarfile.TarError:
            return False
        if first is None or first.name != SNAPSHOT_FILE or not first.isfile() or first.size > max_bytes:
            return False
        data = _extracted(inner, first)
        while piece := data.read(PIECE):
            yield piece
        if inner.next() is not None:
            raise _INVALID
    return True


def _extracted(archive: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    extracted = archive.extractfile(member)
    if extracted is None:
        raise _INVALID
    return extracted


def find(api: Client, tag: str) -> StoredSnapshot | None:
    """The image tagged ``tag`` in :data:`REPOSITORY`, if there is one."""
    with translate(*_UNAVAILABLE):
        try:
            answer = _Inspected.model_validate(api.inspect_image(f"{REPOSITORY}:{tag}"))
        except NotFound:
            return None
    return StoredSnapshot(answer.Id, dict((answer.Config or _Config()).Labels or {}), _our_tags(answer.RepoTags or []))


def listed(api: Client, label: str) -> list[StoredSnapshot]:
    """The images that carry ``label`` (one label: Podman ORs several), tagged in :data:`REPOSITORY` or not (one
    whose tag moved to another is an orphan, which ``reap`` removes)."""
    with translate(*_UNAVAILABLE):
        rows = [_ImageRow.model_validate(row) for row in api.images(filters={"label": label})]
    return [row.stored() for row in rows]


def remove(api: Client, snapshot_id: str) -> bool:
    with translate(ErrorCode.CONTAINER_REMOVAL_FAILED, "the Docker engine could not remove the snapshot"):
        try:
            api.remove_image(snapshot_id, force=True, noprune=False)
        except NotFound:
            return False
        except APIError as error:
            if error.status_code == 404:
                return False
            raise
    return True
