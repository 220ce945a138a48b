"""The answer budget (code_sandbox.sandbox.answer_text): what a sandbox prints or names reaches the client in one line
of at most 4 MiB, its data carried once when it is large, and the server's memory stays bounded while it answers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.sandbox.answer_text import ANSWER_LINE_BYTES

from tests.security.test_wire import WireClient, connect

pytestmark = [pytest.mark.docker]
__all__ = ["connect"]  # the fixture, shared with test_wire

FLOOD = (
    "const chunk = Buffer.alloc(64 * 1024, 1);\n"  # control bytes (0x01): a six-character JSON escape each
    "for (let i = 0; i < 16; i++) { process.stdout.write(chunk); process.stderr.write(chunk); }\n"
)
LINES = "const line = 'x'.repeat(79) + '\\n'; for (let i = 0; i < 13107; i++) process.stdout.write(line);\n"
MiB = 1024 * 1024


def execute(client: WireClient, request_id: str, program: str) -> None:
    arguments = {"files": [{"path": "main.js", "content": program}], "entrypoint": "main.js", "timeout_seconds": 60}
    client.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                 "params": {"name": "execute_javascript", "arguments": arguments}})  # fmt: skip


def answer(client: WireClient) -> tuple[bytes, dict[str, Any]]:
    line = client.receive_raw()
    return line, json.loads(line)


def test_a_run_at_both_output_caps_in_control_bytes_answers_in_one_line_within_the_budget(
    connect: Callable[..., WireClient], engine: DockerEngine
) -> None:
    # 2 MiB of control bytes printed was a 27.3 MB line: each byte a six-character escape in structuredContent and
    # seven more in the text block's copy of the same JSON. Under either runtime: the output takes another way there.
    client = connect(runtime=engine.runtime)
    client.start()
    execute(client, "flood", FLOOD)
    line, message = answer(client)
    client.finish()
    result = message["result"]
    assert len(line) <= ANSWER_LINE_BYTES
    structured = result["structuredContent"]
    assert structured["termination_reason"] == "exited" and structured["exit_code"] == 0
    for stream in ("stdout", "stderr"):  # control pictures (3 bytes each), as many as fit the stream's share
        assert set(structured[stream]) == {"\u2401"} and len(structured[stream]) >= 400_000
        assert structured[f"{stream}_truncated"] is True
    (text,) = result["content"]
    assert text["type"] == "text" and text["text"].startswith("The result is too large to repeat here")
    # Once: a summary, not a second copy; Gemini CLI, which shows its model the text alone, sees each stream's both ends
    # (and keeps a text block of up to 40,000 characters whole).
    assert "stdout: " in text["text"] and "beginning with:" in text["text"] and len(text["text"]) < 40_000


def test_plain_output_at_the_cap_is_carried_whole_and_once(connect: Callable[..., WireClient]) -> None:
    client = connect()
    client.start()
    execute(client, "lines", LINES)
    line, message = answer(client)
    client.finish()
    structured = message["result"]["structuredContent"]
    assert structured["stdout"] == ("x" * 79 + "\n") * 13107 and structured["stdout_truncated"] is False
    assert len(line) < 1.2 * MiB  # the output once, and its newline escapes
    assert not message["result"]["content"][0]["text"].startswith("{")


def test_small_results_still_repeat_their_json_in_the_text_block(connect: Callable[..., WireClient]) -> None:
    client = connect()
    client.start()
    execute(client, "small", "console.log('\\x1b[31mred\\x1b[0m')")
    _, message = answer(client)
    client.finish()
    result = message["result"]
    assert result["structuredContent"]["stdout"] == "\x1b[31mred\x1b[0m\n"  # exactly what was printed
    assert json.loads(result["content"][0]["text"]) == result["structuredContent"]


# 8 directories of 255 control bytes each, then 1,000 files of 200 more: every path about 2.3 KB of control bytes,
# 14 KB of JSON escapes. Listed whole, it was a 32 MB line.
NAMES = """
const fs = require('fs'), path = require('path');
let dir = '/workspace';
for (let i = 0; i < 8; i++) { dir = path.join(dir, String.fromCharCode(1 + i).repeat(255)); fs.mkdirSync(dir); }
for (let i = 0; i < 1000; i++) fs.writeFileSync(path.join(dir, String(i).padStart(4, '0') + '\\x02'.repeat(196)), '');
"""


def test_a_listing_of_control_byte_names_answers_within_the_budget(connect: Callable[..., WireClient]) -> None:
    client = connect()
    client.start()
    ran, (line, message) = in_a_sandbox(client, NAMES, "list_files", {})
    client.finish()
    assert ran["exit_code"] == 0
    listing = message["result"]["structuredContent"]
    assert len(line) <= ANSWER_LINE_BYTES
    assert listing["truncated"] is True and 100 <= len(listing["entries"]) < 1000
    assert all(set(entry["path"]) <= {"\u2401", "\u2402", "\u2403", "\u2404", "\u2405", "\u2406", "\u2407", "\u2408",
                                      "/", *"0123456789"} for entry in listing["entries"])  # fmt: skip


def in_a_sandbox(
    client: WireClient, program: str, tool: str, arguments: dict[str, Any]
) -> tuple[dict[str, Any], tuple[bytes, dict[str, Any]]]:
    """Create a sandbox, run ``program`` in it, call ``tool`` there and destroy it: the run's structured result, and
    the tool's answer line and message."""
    client.send({"jsonrpc": "2.0", "id": "create", "method": "tools/call",
                 "params": {"name": "create_sandbox", "arguments": {}}})  # fmt: skip
    sid = answer(client)[1]["result"]["structuredContent"]["session_id"]
    calls = [
        ("write_files", {"session_id": sid, "files": [{"path": "make.js", "content": program}]}),
        ("run_javascript", {"session_id": sid, "entrypoint": "make.js"}),
        (tool, {"session_id": sid, **arguments}),
        ("destroy_sandbox", {"session_id": sid}),
    ]
    answers: list[tuple[bytes, dict[str, Any]]] = []
    for name, call_arguments in calls:
        client.send({"jsonrpc": "2.0", "id": name, "method": "tools/call",
                     "params": {"name": name, "arguments": call_arguments}})  # fmt: skip
        answers.append(answer(client))
    return answers[1][1]["result"]["structuredContent"], answers[2]


def test_three_runs_at_the_caps_at_once_raise_the_servers_memory_by_at_most_100_mib(
    connect: Callable[..., WireClient], engine: DockerEngine
) -> None:
    # Three such runs took the server from 86 to 305 MiB: each answer was built, serialised, escaped and encoded as
    # whole copies of a 27 MB line.
    client = connect(runtime=engine.runtime)
    client.start()
    execute(client, "warm", "console.log('hello')")  # every code path of a run loaded once
    assert answer(client)[1]["result"]["structuredContent"]["stdout"] == "hello\n"
    pid = client.process.pid
    before = _status_kib(pid, "VmRSS")
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the high-water mark counts from here
    for index in range(3):
        execute(client, f"flood-{index}", FLOOD)
    lines = [answer(client) for _ in range(3)]
    peak = _status_kib(pid, "VmHWM")
    client.finish()
    assert all(len(line) <= ANSWER_LINE_BYTES for line, _ in lines)
    assert (peak - before) / 1024 <= 100, (before, peak)


def _status_kib(pid: int, field: str) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split(f"{field}:")[1].split()[0])


def test_a_text_file_of_control_characters_is_read_exactly_as_far_as_the_budget_goes(
    connect: Callable[..., WireClient],
) -> None:
    # 2 MiB of \x01 is valid UTF-8 text: read whole, its escapes were 12 MiB of JSON in structuredContent alone.
    client = connect()
    client.start()
    program = "require('fs').writeFileSync('/workspace/controls.txt', Buffer.alloc(2 * 1024 * 1024, 1))"
    ran, (line, message) = in_a_sandbox(client, program, "read_file", {"path": "controls.txt", "max_bytes": 2 * MiB})
    client.finish()
    assert ran["exit_code"] == 0
    read = message["result"]["structuredContent"]
    assert len(line) <= ANSWER_LINE_BYTES
    assert read["size"] == 2 * MiB and read["truncated"] is True
    assert set(read["content"]) == {"\x01"} and len(read["content"]) >= 400_000  # the file's own characters
