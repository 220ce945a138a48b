"""A workspace file's sha256, taken by the file helper's digest op: the tests' check that bytes arrived intact."""

from __future__ import annotations

from code_sandbox.channel.guard import Sandboxes
from code_sandbox.channel.protocol import DigestAnswer, DigestRequest
from code_sandbox.paths import validate_path
from code_sandbox.sandbox.workspace import call_file_helper


async def digest_file(sandboxes: Sandboxes, session_id: str, path: str) -> str:
    """The sha256 of a workspace file, computed inside the container."""
    async with sandboxes.channel(session_id) as channel:
        answer = await call_file_helper(channel, DigestRequest(path=validate_path(path)), DigestAnswer)
    return answer.sha256
