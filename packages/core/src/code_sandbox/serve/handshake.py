"""Answering ``initialize`` before the MCP SDK has loaded.

Importing the SDK takes most of a second, and a client waits for the ``initialize`` answer before it does anything
else. That answer depends only on the build (code-sandbox's and the SDK's versions), the instructions (the profile
and the settings) and the protocol version the client asks for. So the first server of a build and configuration
records the SDK's own answer in the state directory; later ones send the recorded answer at once and hand the
request to the SDK once it has loaded, whose answer then only goes into a comparison (a difference is logged and
recorded for the next start). Standard library only: nothing here may wait for the SDK.
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

from code_sandbox.jsonvalue import JSONObject, JSONValue, parse_json
from code_sandbox.liveness import is_private_directory

MAX_ANSWER_BYTES = 256 * 1024
"""A recorded answer is a few KiB (the instructions are the largest part); anything larger is not ours."""
SERVER_NAME = "code-sandbox"

RequestId = int | str


@dataclass(frozen=True)
class Initialize:
    """A client's ``initialize`` request, as far as answering it needs."""

    id: RequestId
    protocol_version: str


def parse_initialize(line: str) -> Initialize | None:
    """The request on ``line`` if it is a well-formed ``initialize``; else ``None``, and the SDK judges it."""
    message = _json_object(line)
    if message is None or message.get("jsonrpc") != "2.0" or message.get("method") != "initialize":
        return None
    request_id, params = message.get("id"), _mapping(message.get("params"))
    if isinstance(request_id, bool) or not isinstance(request_id, int | str) or params is None:
        return None
    # The fields the spec requires; with them the SDK accepts the request as surely as we do.
    version, client = params.get("protocolVersion"), _mapping(params.get("clientInfo"))
    if not isinstance(version, str) or not 0 < len(version) <= 64 or _mapping(params.get("capabilities")) is None:
        return None
    if client is None or not all(isinstance(client.get(key), str) for key in ("name", "version")):
        return None
    return Initialize(request_id, version)


def parse_response(line: str, request_id: RequestId) -> tuple[bool, JSONObject | None]:
    """Whether ``line`` answers the request ``request_id``, and its result if it is a successful answer."""
    message = _json_object(line)
    if message is None or "method" in message or message.get("id") != request_id:
        return False, None
    return True, _mapping(message.get("result"))


def answer_line(request_id: RequestId, result: Mapping[str, JSONValue]) -> bytes:
    """A JSON-RPC answer, one line, as the SDK writes one."""
    message = {"jsonrpc": "2.0", "id": request_id, "result": result}
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode() + b"\n"


def build_identity(instructions: str) -> list[str]:
    """What an ``initialize`` answer depends on besides the requested protocol version."""
    return [SERVER_NAME, metadata.version("code-sandbox-core"), metadata.version("mcp"), instructions]


class RecordedAnswers:
    """The SDK's ``initialize`` answers, recorded by earlier servers: one JSON file per identity and requested
    protocol version, in a private directory of the state directory. Only a regular file this user owns counts;
    anything odd reads as "not recorded", and a failure to record only means the next start waits for the SDK."""

    def __init__(self, directory: Path, identity: Sequence[str]) -> None:
        self.directory = directory
        self._identity = list(identity)

    def _path(self, protocol_version: str) -> Path:
        key = json.dumps([*self._identity, protocol_version]).encode()
        return self.directory / f"{hashlib.sha256(key).hexdigest()[:32]}.json"

    def _private_directory(self) -> bool:
        """Whether the directory is a real one of this user that nobody else can write."""
        try:
            return is_private_directory(os.lstat(self.directory))
        except OSError:
            return False

    def get(self, protocol_version: str) -> JSONObject | None:
        if not self._private_directory():
            return None
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self._path(protocol_version), flags)  # non-blocking: a FIFO planted here cannot hang us
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

    def put(self, protocol_version: str, result: Mapping[str, JSONValue]) -> None:
        """Record the SDK's answer to a request for ``protocol_version``; only for a version the SDK agreed to, so
        that there is at most one file per version the SDK knows, whatever clients ask for."""
        if result.get("protocolVersion") != protocol_version:
            return
        try:
            data = json.dumps(result, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
        except ValueError:  # not JSON (NaN), so not an answer the SDK sent
            return
        if len(data) > MAX_ANSWER_BYTES:
            return
        path = self._path(protocol_version)
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
