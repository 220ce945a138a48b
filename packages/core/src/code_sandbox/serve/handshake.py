"""Answering ``initialize``, ``server/discover`` and ``tools/list`` before the MCP SDK has loaded.

Importing the SDK takes most of a second, and a client waits for these answers before it does anything else; Codex
starts its model's first turn about a second after it spawns a server, with the tools it has by then. Each answer
depends only on the build (code-sandbox's and the SDK's versions), the server's texts and settings, the protocol
version, and for ``tools/list`` the packages of the sandbox image. So the first server of a build and configuration
records the SDK's own answers in the state directory; later ones send the recorded answer at once and hand the
request to the SDK once it has loaded, whose answer then only goes into a comparison (a difference is logged and
recorded for the next start; a tool list that changed is announced with ``notifications/tools/list_changed``).
Standard library only: nothing here may wait for the SDK.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal

from code_sandbox.jsonvalue import JSONObject, JSONValue, parse_json
from code_sandbox.liveness import is_private_directory

MAX_ANSWER_BYTES = 256 * 1024
"""A recorded answer is a few KiB (the instructions are the largest part); anything larger is not ours."""
SERVER_NAME = "code-sandbox"

RequestId = int | str

KNOWN_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28")
"""The protocol versions there are (the SDK's ``KNOWN_PROTOCOL_VERSIONS``, tested equal): an answer is recorded for
one of these, or for an ``initialize`` whose version the SDK agreed to, so there is a bounded number of records
whatever clients ask for."""
VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
"""Where a request of the stateless protocol (2026-07-28) carries its version: ``params._meta``."""
ANSWER_KEYS = {"initialize": "protocolVersion", "server/discover": "supportedVersions", "tools/list": "tools"}
"""The methods answered early, each with a key its result always has: an answer to a reused request id that lacks
it is another request's."""


@dataclass(frozen=True)
class EarlyRequest:
    """A request that may be answered from the record, as far as answering it needs."""

    id: RequestId
    method: str
    protocol_version: str
    """The version the answer is for: asked in ``initialize``, carried by a stateless request, or, for a session's
    ``tools/list``, the one its ``initialize`` was answered with."""
    stateless: bool = False
    """Whether it came on a stateless connection, where the server sends no notification of its own."""
    record_only: bool = False
    """Whether only the SDK's answer is wanted, for the record: a session's ``tools/list`` after an ``initialize`` that
    the SDK answered, kept under the version the client asked for (the SDK's, unless it countered)."""


SMALL_REQUEST_CHARS = 64 * 1024
"""Lines longer than this are never parsed here: every request answered early is a few hundred characters."""


class FrontDesk:
    """Which of a connection's requests may be answered from the record. The first request decides the protocol era,
    as the SDK decides it: one carrying the stateless envelope opens a stateless connection (``server/discover`` and
    ``tools/list`` answered early), anything else a session (its ``initialize``, then its ``tools/list``)."""

    def __init__(self) -> None:
        self.era: Literal["session", "stateless", "off"] | None = None
        self.session_version: str | None = None
        """The protocol version of the session's ``initialize`` as it was answered early, if it was."""
        self.asked_version: str | None = None
        """The protocol version the session's ``initialize`` asked for."""

    def consider(self, line: str) -> EarlyRequest | None:
        """The request on ``line`` if the record may answer it; else ``None``, and the SDK alone judges it."""
        if self.era == "off":
            return None
        message = _json_object(line) if len(line) <= SMALL_REQUEST_CHARS else None
        if message is None:
            self.era = self.era or "off"  # a first line that is not judged here: the SDK decides everything
            return None
        method, request_id = message.get("method"), message.get("id")
        if not isinstance(method, str) or "id" not in message:
            return None  # a notification or an answer decides nothing
        params = _mapping(message.get("params")) if "params" in message else {}
        meta = _mapping(params.get("_meta")) if params is not None and "_meta" in params else {}
        envelope = meta.get(VERSION_KEY) if meta is not None else None
        first = self.era is None
        if first:
            self.era = "stateless" if method != "initialize" and envelope is not None else "session"
        if message.get("jsonrpc") != "2.0" or isinstance(request_id, bool) or not isinstance(request_id, int | str):
            return None
        if params is None or meta is None or method not in ANSWER_KEYS:
            return None
        if self.era == "session":
            if method == "initialize":  # only as the first request: a second one is the SDK's to refuse
                version = _initialize_version(params) if first else None
                self.asked_version = version
                return EarlyRequest(request_id, method, version) if version is not None else None
            version = (self.session_version or self.asked_version) if envelope is None else None
        else:
            version = envelope if method != "initialize" else None
        if not isinstance(version, str) or version not in KNOWN_VERSIONS or set(params) - {"_meta"}:
            return None  # a cursor, or anything else the record does not answer
        record_only = self.era == "session" and self.session_version is None
        return EarlyRequest(request_id, method, version, stateless=self.era == "stateless", record_only=record_only)

    def answered(self, request: EarlyRequest, result: JSONObject) -> None:
        """``request`` was answered early with ``result``."""
        if request.method == "initialize" and isinstance(version := result.get("protocolVersion"), str):
            self.session_version = version


def _initialize_version(params: JSONObject) -> str | None:
    # The fields the spec requires; with them the SDK accepts the request as surely as we do.
    version, client = params.get("protocolVersion"), _mapping(params.get("clientInfo"))
    if not isinstance(version, str) or not 0 < len(version) <= 64 or _mapping(params.get("capabilities")) is None:
        return None
    if client is None or not all(isinstance(client.get(key), str) for key in ("name", "version")):
        return None
    return version


def parse_response(line: str, request: EarlyRequest) -> tuple[bool, JSONObject | None]:
    """Whether ``line`` answers ``request``, and its result if it is a successful answer."""
    message = _json_object(line)
    if message is None or "method" in message or message.get("id") != request.id:
        return False, None
    result = _mapping(message.get("result"))
    if result is not None and ANSWER_KEYS[request.method] not in result:
        return False, None  # the answer to a later request that reused the id
    return True, result


def answer_line(request_id: RequestId, result: Mapping[str, JSONValue]) -> bytes:
    """A JSON-RPC answer, one line, as the SDK writes one."""
    message = {"jsonrpc": "2.0", "id": request_id, "result": result}
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode() + b"\n"


def build_identity(*texts: str) -> list[str]:
    """What the early answers depend on besides the method and the protocol version: the versions, and ``texts``
    (the instructions, the profile's tool texts, the settings)."""
    return [SERVER_NAME, metadata.version("code-sandbox-core"), metadata.version("mcp"), *texts]


class RecordedAnswers:
    """The SDK's answers, recorded by earlier servers: one JSON file per identity, method and protocol version, in a
    private directory of the state directory. Only a regular file this user owns counts; anything odd reads as "not
    recorded", and a failure to record only means the next start waits for the SDK."""

    def __init__(self, directory: Path, identity: Sequence[str]) -> None:
        self.directory = directory
        self._identity = list(identity)

    def _path(self, request: EarlyRequest) -> Path:
        key = json.dumps([*self._identity, request.protocol_version, request.method]).encode()
        return self.directory / f"{hashlib.sha256(key).hexdigest()[:32]}.json"

    def _private_directory(self) -> bool:
        """Whether the directory is a real one of this user that nobody else can write."""
        try:
            return is_private_directory(os.lstat(self.directory))
        except OSError:
            return False

    def get(self, request: EarlyRequest) -> JSONObject | None:
        if not self._private_directory():
            return None
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self._path(request), flags)  # non-blocking: a FIFO planted here cannot hang us
        except OSError:
            return None
        try:
            facts = os.fstat(fd)
            if not stat.S_ISREG(facts.st_mode) or facts.st_uid != os.geteuid() or facts.st_size > MAX_ANSWER_BYTES:
                return None
            text = os.read(fd, MAX_ANSWER_BYTES + 1).decode("utf-8", "strict")
        except (OSError, UnicodeDecodeError):
            return None
        finally:
            os.close(fd)
        return _json_object(text)

    def put(self, request: EarlyRequest, result: Mapping[str, JSONValue]) -> None:
        """Record the SDK's answer to ``request``: for a known version, or one the SDK agreed to (see
        :data:`KNOWN_VERSIONS`)."""
        if request.protocol_version not in KNOWN_VERSIONS and result.get("protocolVersion") != request.protocol_version:
            return
        try:
            data = json.dumps(result, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
        except ValueError:  # not JSON (NaN), so not an answer the SDK sent
            return
        if len(data) > MAX_ANSWER_BYTES:
            return
        path = self._path(request)
        partial = path.with_name(f".{secrets.token_hex(8)}.partial")
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not self._private_directory():
                return
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(partial, path)
        except OSError:
            with contextlib.suppress(OSError):
                partial.unlink()


def _json_object(text: str) -> JSONObject | None:
    """``text`` as a JSON object; ``None`` for anything else, NaN and Infinity included (not JSON)."""
    try:
        return _mapping(parse_json(text))
    except (ValueError, RecursionError):
        return None


def _mapping(value: JSONValue) -> JSONObject | None:
    """``value`` if it is a JSON object."""
    return value if isinstance(value, dict) else None
