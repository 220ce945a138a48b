"""The MCP server as a client sees it. Most tests drive an in-process server through the SDK's client (the same
JSON-RPC session, argument validation, error shaping and structured content as over stdio); the rest run
`code-sandbox serve` as a subprocess where the process is the subject: stdio, exit, signals, sweeps, stdout.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import signal
import stat
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, Self, cast

import anyio
import anyio.to_thread
import pytest
from code_sandbox.channel.channels import ChannelTransport
from code_sandbox.channel.protocol import ExecuteAnswer, ExecuteRequest, Refusal
from code_sandbox.channel.transport import StderrSink, Target
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.doctor import Finding
from code_sandbox.doctor import _check_capacity as check_capacity  # pyright: ignore[reportPrivateUsage]
from code_sandbox.engine import DaemonFacts, Engine
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import (
    LABEL_EXPIRES_AT,
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_TAG,
    ContainerRequest,
    Hardening,
)
from code_sandbox.limits import MEMORY_BYTES, PROCESSES, WORDS, MiB, sessions_backed
from code_sandbox.plugins import create_plugin_manager, select_profile
from code_sandbox.profile import Profile
from code_sandbox.sandbox.service import SandboxService
from code_sandbox.serve.server import SandboxServer
from code_sandbox.serve.tool_calls import compact_schema
from code_sandbox.settings import load_settings
from jsonschema import Draft202012Validator
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult, ImageContent, ListToolsResult, TextContent, Tool

from tests.conftest import WORKER_TAG
from tests.support import clients
from tests.support.clock import FakeClock
from tests.support.edited_transport import EditedTransport, install
from tests.support.forwarding_engine import ForwardingEngine
from tests.support.run import command_env, worker_containers

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("image_id", "cleanup_managed")]

CLI = str(Path(sys.executable).parent / "code-sandbox")
TEE = str(Path(__file__).parent / "support" / "stdout_tee.py")
SECRET = "S3CR3T-VALUE-7f9a"  # noqa: S105 - a marker that must never be echoed, not a password


def settings_of(tmp_path: Path, **settings: str) -> dict[str, str]:
    """The settings of a test's server by name: the audit log under ``tmp_path``, and no warm pool unless asked
    (container counts below are exact; the pool has tests of its own)."""
    return {"audit_log": str(tmp_path / "state" / "audit.jsonl"), "warm_pool": "0"} | settings


def server_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    """The environment of a ``code-sandbox serve`` subprocess with the test's settings."""
    env = command_env(**settings_of(tmp_path, **settings))
    env["XDG_STATE_HOME"] = str(tmp_path / "xdg-state")  # liveness markers: the test's own, not the user's
    return env


def connect(engine: Engine, tmp_path: Path, *, clock: Callable[[], float] | None = None, **settings: str) -> Client:
    """The SDK's client, connected to an in-process server on the test's engine (so its containers carry this
    worker's tag), with its liveness marker and audit log under ``tmp_path``.

    ``mode="legacy"`` keeps the initialize handshake and the JSON-RPC session over memory streams, as over stdio;
    the SDK's other in-process mode would call the handlers without JSON-RPC. ``clock`` replaces the session
    manager's monotonic clock.
    """
    server = make_server(engine, tmp_path, **settings)
    if clock is not None:
        server.manager.clock = clock
    return Client(server, mode="legacy")


def make_server(engine: Engine, tmp_path: Path, **settings: str) -> SandboxServer:
    """An in-process server on the test's engine, with its liveness marker and audit log under ``tmp_path``."""
    environ = {f"CODE_SANDBOX_{name.upper()}": value for name, value in settings_of(tmp_path, **settings).items()}
    loaded = load_settings(environ)
    profile = select_profile(create_plugin_manager(), loaded.profile)
    return SandboxServer(
        SandboxService(loaded, profile, engine=engine, state_dir=tmp_path / "xdg-state" / "code-sandbox")
    )


async def none_of_mine(engine: DockerEngine, within: float = 20) -> None:
    """Wait (at most ``within`` seconds) until this worker has no managed container left."""
    with anyio.fail_after(within):
        while await anyio.to_thread.run_sync(worker_containers, engine):  # noqa: ASYNC110 - Docker has no event to await
            await anyio.sleep(0.1)


def error_code_or_none(result: CallToolResult) -> str | None:
    return error_code(result) if result.is_error else None


def ok(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    content: object = result.structured_content
    assert isinstance(content, dict)
    return cast(dict[str, Any], content)


def error_code(result: CallToolResult) -> str:
    assert result.is_error
    block = result.content[0]
    assert isinstance(block, TextContent)
    text = block.text
    assert result.structured_content is None  # the TypeScript SDK's client checks it against the output schema
    return text.split(":", 1)[0]


async def test_the_tool_list_documents_every_parameter_with_annotations_and_output_schemas(
    tmp_path: Path, engine: DockerEngine
) -> None:
    async with connect(engine, tmp_path) as client:
        tools = (await client.list_tools()).tools
    names = {tool.name for tool in tools}
    assert names == {
        "create_sandbox", "write_files", "list_files", "read_file", "delete_files", "run_javascript",
        "destroy_sandbox", "execute_javascript", "evaluate_javascript", "snapshot_sandbox", "list_snapshots",
    }  # fmt: skip
    for tool in tools:
        assert tool.description and len(tool.description) > 120, tool.name  # purpose, and when to use a sibling
        assert tool.output_schema is not None, tool.name
        assert tool.input_schema.get("additionalProperties") is False, tool.name
        annotations = tool.annotations
        assert annotations is not None and annotations.open_world_hint is False, tool.name
        assert None not in (annotations.read_only_hint, annotations.destructive_hint, annotations.idempotent_hint)
        for name, prop in tool.input_schema.get("properties", {}).items():
            assert prop.get("description"), (tool.name, name)
    by_name = {tool.name: tool for tool in tools}
    hints = {name: (tool.annotations.read_only_hint, tool.annotations.idempotent_hint)  # type: ignore[union-attr]
             for name, tool in by_name.items()}  # fmt: skip
    assert hints == {
        "create_sandbox": (False, False), "write_files": (False, True), "list_files": (True, True),
        "read_file": (True, True), "delete_files": (False, True), "run_javascript": (False, False),
        "destroy_sandbox": (False, True), "execute_javascript": (False, False), "evaluate_javascript": (False, False),
        "snapshot_sandbox": (False, False), "list_snapshots": (True, True),
    }  # fmt: skip
    # Their effects never leave a disposable sandbox the caller made: none touches the user's world (README).
    assert {(tool.annotations.destructive_hint, tool.annotations.open_world_hint) for tool in tools} == {(False, False)}  # type: ignore[union-attr]
    run_props = by_name["run_javascript"].input_schema["properties"]
    assert run_props["timeout_seconds"]["maximum"] == 120 and run_props["arguments"]["maxItems"] == 32
    assert "execute_javascript" in (by_name["create_sandbox"].description or "")


def test_every_size_the_tools_mention_is_an_enforced_limit(profile: Profile) -> None:
    """Tool text, schemas and the profile's run description are formatted from the limits module, never retyped."""
    server = SandboxServer(SandboxService(load_settings({}), profile))
    texts = [text for tool in server.tool_defs.values() for text in _texts(tool.describe())]
    enforced = set(WORDS.values())
    sizes = {match.group(0) for text in texts for match in re.finditer(r"\b\d+ (?:MiB|KiB|GiB)\b", text)}
    assert sizes and sizes <= enforced, sizes - enforced
    assert not any(re.search(r"\{[a-z_]+\}", text) for text in texts)  # every placeholder was filled
    run_tool = server.tool_defs[profile.info.run_tool_name].describe()
    assert f"{WORDS['memory']} memory" in (run_tool.description or "")
    assert f"passed {WORDS['output_cap']}" in json.dumps(run_tool.output_schema)  # the cap, where a cut is reported
    assert Hardening().memory_bytes == MEMORY_BYTES and Hardening().pids_limit == PROCESSES


def _texts(tool: Tool) -> list[str]:
    """The tool's description and every description in its input and output schemas."""
    found = [tool.description or ""]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in cast(dict[str, object], node).items():
                if key == "description" and isinstance(value, str):
                    found.append(value)
                walk(value)
        elif isinstance(node, list):
            for item in cast(list[object], node):
                walk(item)

    walk([tool.input_schema, tool.output_schema])
    return found


URL_FILES = {
    "normalize.js": """
exports.normalize = (raw) => {
  const url = new URL(raw.trim());
  url.hash = '';
  url.hostname = url.hostname.toLowerCase();
  const defaults = { 'https:': '443', 'http:': '80' };
  if (url.port === defaults[url.protocol]) url.port = '';
  const path = url.pathname.replace(/\\/+$/, '');
  return `${url.protocol}//${url.host}${path}${url.search}`;
};
""",
    "test-data.js": """
module.exports = ['https://Example.com/a/', 'https://example.com:443/a', 'http://example.com/b#x', 'https://EXAMPLE.com/a'];
""",
    "index.js": """
const { normalize } = require('./normalize');
const urls = require('./test-data');
const unique = [...new Set(urls.map(normalize))];
console.log(JSON.stringify(unique));
""",
}


async def test_the_iterate_workflow_writes_lists_runs_overwrites_reruns_and_destroys(
    tmp_path: Path, engine: DockerEngine
) -> None:
    async with connect(engine, tmp_path) as client:
        session_id = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        files = [{"path": path, "content": content} for path, content in URL_FILES.items()]
        written = ok(await client.call_tool("write_files", {"session_id": session_id, "files": files}))
        assert [r["status"] for r in written["results"]] == ["written"] * 3
        listed = ok(await client.call_tool("list_files", {"session_id": session_id}))
        assert [e["path"] for e in listed["entries"]] == ["index.js", "normalize.js", "test-data.js"]
        first = ok(await client.call_tool("run_javascript", {"session_id": session_id, "entrypoint": "index.js"}))
        assert json.loads(first["stdout"]) == ["https://example.com/a", "http://example.com/b"]
        extra = "module.exports = ['https://example.com/a', 'https://other.org/'];"
        update = {"session_id": session_id, "files": [{"path": "test-data.js", "content": extra}], "overwrite": True}
        assert ok(await client.call_tool("write_files", update))["results"][0]["status"] == "overwritten"
        second = ok(await client.call_tool("run_javascript", {"session_id": session_id, "entrypoint": "index.js"}))
        assert json.loads(second["stdout"]) == ["https://example.com/a", "https://other.org"]
        assert ok(await client.call_tool("destroy_sandbox", {"session_id": session_id})) == {"destroyed": True}
        assert ok(await client.call_tool("destroy_sandbox", {"session_id": session_id})) == {"destroyed": False}
    audit = tmp_path / "state" / "audit.jsonl"
    assert stat.S_IMODE(audit.stat().st_mode) == 0o600
    text = audit.read_text()
    records = [json.loads(line) for line in text.splitlines()]
    assert [r["tool"] for r in records] == [
        "create_sandbox", "write_files", "list_files", "run_javascript", "write_files", "run_javascript",
        "destroy_sandbox", "destroy_sandbox",
    ]  # fmt: skip
    assert {r["result"] for r in records} == {"OK"}
    assert len({r["session"] for r in records}) == 1
    assert session_id not in text and "normalize" not in text and "example.com" not in text
    assert str(tmp_path) not in text and str(Path.home()) not in text
    assert records[1]["files"] == 3 and records[3]["exit_code"] == 0


async def test_execute_javascript_runs_once_and_leaves_no_sandbox(tmp_path: Path, engine: DockerEngine) -> None:
    async with connect(engine, tmp_path) as client:
        arguments = {"files": [{"path": "a.mjs", "content": "console.log(6 * 7)"}], "entrypoint": "a.mjs"}
        assert ok(await client.call_tool("execute_javascript", arguments))["stdout"] == "42\n"
        failing = {"files": [{"path": "a.js", "content": "throw new Error('x')"}], "entrypoint": "a.js"}
        assert ok(await client.call_tool("execute_javascript", failing))["exit_code"] == 1
        await none_of_mine(engine)  # removed after the reply


async def test_execute_checks_everything_first_then_sends_files_and_run_as_one_request(
    tmp_path: Path, engine: DockerEngine
) -> None:
    server = make_server(engine, tmp_path)
    recorder = EditedTransport(server.engine, server.profile, "execute", lambda line, _sink: line)
    install(server.manager, recorder)
    async with Client(server, mode="legacy") as client:
        files = [{"path": "a.mjs", "content": "console.log(6 * 7)"}, {"path": "lib/b.txt", "content": "b"}]
        arguments = {"files": files, "entrypoint": "a.mjs"}
        assert ok(await client.call_tool("execute_javascript", arguments))["stdout"] == "42\n"
        assert recorder.operations == ["execute"]
        bad_path = {"files": [{"path": "../a.mjs", "content": "x"}], "entrypoint": "a.mjs"}
        assert error_code(await client.call_tool("execute_javascript", bad_path)) == "PATH_TRAVERSAL"
        bad_entry = {"files": [{"path": "a.mjs", "content": "x"}], "entrypoint": "a.py"}
        assert error_code(await client.call_tool("execute_javascript", bad_entry)) == "INVALID_PATH"
        missing_entry = {"files": [{"path": "a.mjs", "content": "x"}], "entrypoint": "b.mjs"}
        assert error_code(await client.call_tool("execute_javascript", missing_entry)) == "INVALID_REQUEST"
        assert ok(await client.call_tool("execute_javascript", arguments))["stdout"] == "42\n"
        assert recorder.operations == ["execute", "execute"]  # the others were refused before a sandbox was taken
        await none_of_mine(engine)


TYPESCRIPT = [
    {
        "path": "main.ts",
        "content": "import { greet } from './lib/greet.ts';\nconst n: number = 41;\nconsole.log(greet('ts'), n + 1);",
    },
    {"path": "lib/greet.ts", "content": "export function greet(name: string): string { return `hello ${name}`; }"},
    {"path": "enum.mts", "content": "enum Color { Red }\nconsole.log(Color.Red);"},
]


async def test_typescript_runs_with_its_types_stripped_in_one_shots_and_sessions(
    tmp_path: Path, engine: DockerEngine
) -> None:
    async with connect(engine, tmp_path) as client:
        one_shot = ok(await client.call_tool("execute_javascript", {"files": TYPESCRIPT, "entrypoint": "main.ts"}))
        assert (one_shot["exit_code"], one_shot["stdout"], one_shot["stderr"]) == (0, "hello ts 42\n", "")
        sid = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        ok(await client.call_tool("write_files", {"session_id": sid, "files": TYPESCRIPT}))
        again = ok(await client.call_tool("run_javascript", {"session_id": sid, "entrypoint": "main.ts"}))
        assert again["stdout"] == "hello ts 42\n"
        unsupported = ok(await client.call_tool("run_javascript", {"session_id": sid, "entrypoint": "enum.mts"}))
        assert unsupported["exit_code"] == 1 and "ERR_UNSUPPORTED_TYPESCRIPT_SYNTAX" in unsupported["stderr"]
        ok(await client.call_tool("destroy_sandbox", {"session_id": sid}))


class HeldRemoval(ForwardingEngine):
    """The test's engine, whose container removals wait until the test lets them go (Docker cannot be made slow
    on demand)."""

    def __init__(self, engine: DockerEngine) -> None:
        super().__init__(engine)
        self.released = threading.Event()
        self.waiting = threading.Event()
        self.asked: list[str] = []
        """The containers whose removal was asked for, in order."""

    def remove_container(self, container_id: str) -> bool:
        self.asked.append(container_id)
        self.waiting.set()
        self.released.wait(30)
        return super().remove_container(container_id)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        """Whatever the test did, no removal stays held past it."""
        self.released.set()


async def test_a_one_shot_replies_before_its_sandbox_is_removed_which_still_counts_until_then(
    tmp_path: Path, engine: DockerEngine
) -> None:
    with HeldRemoval(engine) as held:
        async with connect(held, tmp_path, max_sessions="1") as client:
            arguments = {"files": [{"path": "a.js", "content": "console.log(1)"}], "entrypoint": "a.js"}
            with anyio.fail_after(30):
                assert ok(await client.call_tool("execute_javascript", arguments))["stdout"] == "1\n"
            assert held.waiting.is_set() and len(worker_containers(engine)) == 1  # the reply came first
            assert error_code(await client.call_tool("create_sandbox", {})) == "SESSION_LIMIT_EXCEEDED"
            held.released.set()
            await none_of_mine(engine)
            with anyio.fail_after(10):
                while error_code_or_none(await client.call_tool("create_sandbox", {})) is not None:  # noqa: ASYNC110
                    await anyio.sleep(0.05)  # the registry lets go once Docker confirmed the removal


async def test_every_client_reachable_error_code_arrives_as_a_tool_error(tmp_path: Path, engine: DockerEngine) -> None:
    async with connect(engine, tmp_path, max_sessions="2") as client:
        sid = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        other = ok(await client.call_tool("create_sandbox", {}))["session_id"]

        async def call(tool: str, **arguments: Any) -> str:
            return error_code(await client.call_tool(tool, arguments))

        assert await call("create_sandbox") == "SESSION_LIMIT_EXCEEDED"
        assert await call("list_files", session_id="A" * 43) == "INVALID_SESSION"
        assert await call("read_file", session_id=sid, path="../../etc/passwd") == "PATH_TRAVERSAL"
        assert await call("read_file", session_id=sid, path="C:/windows") == "INVALID_PATH"
        assert await call("read_file", session_id=sid, path="missing.txt") == "NOT_FOUND"
        big = [{"path": "big.txt", "content": "x" * (2 * 1024 * 1024 + 1)}]
        assert await call("write_files", session_id=sid, files=big) == "FILE_TOO_LARGE"
        many = [{"path": f"src/{i}.js", "content": ""} for i in range(100)]
        assert await call("write_files", session_id=sid, files=many) == "WORKSPACE_LIMIT_EXCEEDED"
        binary = "const fs = require('fs'); fs.writeFileSync('bin.dat', Buffer.from([0, 0xff]));"
        binary += "fs.writeFileSync('ro.txt', 'x'); fs.chmodSync('ro.txt', 0)"
        await client.call_tool("write_files", {"session_id": sid, "files": [{"path": "mk.js", "content": binary}]})
        ok(await client.call_tool("run_javascript", {"session_id": sid, "entrypoint": "mk.js"}))
        assert await call("read_file", session_id=sid, path="bin.dat") == "BINARY_FILE"
        assert await call("read_file", session_id=sid, path="ro.txt") == "PERMISSION_DENIED"
        assert await call("run_javascript", session_id=sid, entrypoint="mk.py") == "INVALID_PATH"
        assert (
            await call("run_javascript", session_id=sid, entrypoint="mk.js", timeout_seconds=121) == "INVALID_REQUEST"
        )
        stop = [{"path": "stop.js", "content": "process.kill(process.ppid, 'SIGSTOP'); setInterval(() => {}, 1000)"}]
        await client.call_tool("write_files", {"session_id": other, "files": stop})
        assert await call("run_javascript", session_id=other, entrypoint="stop.js", timeout_seconds=1) == "TIMEOUT"
        assert await call("list_files", session_id=other) == "INVALID_SESSION"  # destroyed by the safety net
        link = [{"path": "ln.js", "content": "require('fs').symlinkSync('/etc/passwd', 'pw')"}]
        await client.call_tool("write_files", {"session_id": sid, "files": link})
        ok(await client.call_tool("run_javascript", {"session_id": sid, "entrypoint": "ln.js"}))
        assert await call("read_file", session_id=sid, path="pw") == "WORKSPACE_INTEGRITY"


async def test_an_idle_sandbox_answers_session_expired(tmp_path: Path, engine: DockerEngine) -> None:
    clock = FakeClock()
    idle = {"idle_timeout": "10", "max_lifetime": "30", "max_timeout": "20", "default_timeout": "5"}
    async with connect(engine, tmp_path, clock=clock, **idle) as client:
        sid = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        assert len(worker_containers(engine)) == 1  # the in-process server's containers carry this worker's tag
        clock.advance(9.5)
        ok(await client.call_tool("list_files", {"session_id": sid}))  # not idle long enough; the call resets it
        clock.advance(10.5)  # idle for 10.5 s, 20 s old: the idle timeout, not the lifetime, ends it
        result = await client.call_tool("list_files", {"session_id": sid})
        assert error_code(result) in ("SESSION_EXPIRED", "INVALID_SESSION")  # the reaper may have been first
        await none_of_mine(engine)


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("create_sandbox", {"profile": SECRET}),
        ("read_file", {"session_id": SECRET, "path": "a.js"}),
        ("read_file", {"session_id": "A" * 43, "path": SECRET * 100}),
        ("read_file", {"session_id": "A" * 43, "path": "a.js", "max_bytes": SECRET}),
        ("read_file", {"session_id": "A" * 43, "path": "a.js", "max_bytes": 10**12}),
        ("write_files", {"session_id": "A" * 43, "files": [{"path": "a", "content": 5, "mode": SECRET}]}),
        ("write_files", {"session_id": "A" * 43, "files": SECRET}),
        ("run_javascript", {"session_id": "A" * 43, "entrypoint": "a.js", "arguments": [SECRET] * 40}),
        ("list_files", {"session_id": "A" * 43, "max_depth": "3"}),
        ("read_file", {"session_id": "A" * 43, "path": f"../{SECRET}"}),
        ("read_file", {"session_id": "A" * 43, "path": f"{SECRET}\u202e.js"}),
    ],
)
async def test_invalid_arguments_give_a_coded_error_without_echoing_the_input(
    tmp_path: Path, engine: DockerEngine, tool: str, arguments: dict[str, Any]
) -> None:
    async with connect(engine, tmp_path) as client:
        result = await client.call_tool(tool, arguments)
    assert error_code(result) in ("INVALID_REQUEST", "INVALID_PATH", "PATH_TRAVERSAL")
    assert SECRET not in json.dumps(result.model_dump(mode="json"))
    assert "input_value" not in result.content[0].text  # type: ignore[union-attr]


async def test_a_cancelled_run_frees_its_sandbox_and_the_server_stays_responsive(
    tmp_path: Path, engine: DockerEngine
) -> None:
    async with connect(engine, tmp_path) as client:
        sid = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        other = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        slow = [{"path": "slow.js", "content": "setTimeout(() => {}, 60000)"}]
        ok(await client.call_tool("write_files", {"session_id": sid, "files": slow}))
        timings: dict[str, float] = {}
        running = anyio.Event()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            del progress, total, message
            running.set()  # the first progress notification: the run is under way

        async with anyio.create_task_group() as group:

            async def long_run() -> None:
                await client.call_tool(
                    "run_javascript",
                    {"session_id": sid, "entrypoint": "slow.js", "timeout_seconds": 60},
                    progress_callback=on_progress,
                )

            group.start_soon(long_run)
            with anyio.fail_after(30):
                await running.wait()
            started = time.monotonic()
            ok(await client.call_tool("list_files", {"session_id": other}))
            timings["other"] = time.monotonic() - started
            group.cancel_scope.cancel()
        cancelled = time.monotonic()
        ok(await client.call_tool("list_files", {"session_id": sid}))  # needs the lease the run held
        timings["freed"] = time.monotonic() - cancelled
        count = [
            {
                "path": "n.js",
                "content": "const fs = require('fs'); console.log(fs.readdirSync('/proc').filter(p => /^\\d+$/.test(p)"
                " && fs.statSync(`/proc/${p}`).uid === process.getuid()).length)",
            }
        ]
        ok(await client.call_tool("write_files", {"session_id": sid, "files": count}))
        processes = ok(await client.call_tool("run_javascript", {"session_id": sid, "entrypoint": "n.js"}))
    # The run lasts 60 s: "freed" and "served" mean far below that, however loaded the machine is.
    assert timings["freed"] < 10 and timings["other"] < 10, timings
    assert processes["stdout"] == "2\n"  # of the sandbox's uid, the runner and this program: the 60 s one is gone


async def test_progress_notifications_arrive_during_a_long_run(tmp_path: Path, engine: DockerEngine) -> None:
    updates: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        updates.append((progress, message))

    async with connect(engine, tmp_path) as client:
        arguments = {
            "files": [
                {
                    "path": "p.js",
                    "content": "let i=0; const t=setInterval(()=>{console.log(i); if(++i>12) clearInterval(t)}, 200)",
                }
            ],
            "entrypoint": "p.js",
        }
        ok(await client.call_tool("execute_javascript", arguments, progress_callback=on_progress))
    assert len(updates) >= 1
    assert updates[-1][0] >= 1 and "output bytes" in (updates[-1][1] or "")


CHART = (Path(__file__).parent.parent / "examples" / "chart" / "chart.mjs").read_text()


def png_chunks(data: bytes) -> list[bytes]:
    """The chunk types of a PNG, each chunk's CRC checked, its image data inflated to prove it whole."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    types: list[bytes] = []
    position, image = 8, b""
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind, body = data[position + 4 : position + 8], data[position + 8 : position + 8 + length]
        assert struct.unpack(">I", data[position + 8 + length : position + 12 + length])[0] == zlib.crc32(kind + body)
        image += body if kind == b"IDAT" else b""
        types.append(kind)
        position += 12 + length
    width, height = struct.unpack(">II", data[16:24])
    assert len(zlib.decompress(image)) == (width * 3 + 1) * height
    return types


async def test_binary_files_go_in_and_out_as_base64_and_pictures_come_back_as_images(
    tmp_path: Path, engine: DockerEngine
) -> None:
    payload = os.urandom(100 * 1024)
    copy = "require('fs').copyFileSync('in.bin', 'out/copy.bin')"
    async with connect(engine, tmp_path) as client:
        sid = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        files = [
            {"path": "in.bin", "content": base64.b64encode(payload).decode(), "encoding": "base64"},
            {"path": "copy.js", "content": "require('fs').mkdirSync('out');" + copy},
            {"path": "chart.mjs", "content": CHART},
        ]
        ok(await client.call_tool("write_files", {"session_id": sid, "files": files}))
        assert (
            ok(await client.call_tool("run_javascript", {"session_id": sid, "entrypoint": "copy.js"}))["exit_code"] == 0
        )
        back = await client.call_tool(
            "read_file", {"session_id": sid, "path": "out/copy.bin", "encoding": "base64", "max_bytes": 2 * 1024 * 1024}
        )
        assert base64.b64decode(ok(back)["content"]) == payload and ok(back)["image_type"] is None
        assert len(back.content) == 1
        as_text = await client.call_tool("read_file", {"session_id": sid, "path": "out/copy.bin"})
        assert error_code(as_text) == "BINARY_FILE"
        first = ok(
            await client.call_tool(
                "read_file", {"session_id": sid, "path": "in.bin", "encoding": "base64", "max_bytes": 10}
            )
        )
        assert (base64.b64decode(first["content"]), first["truncated"]) == (payload[:10], True)

        assert (
            ok(await client.call_tool("run_javascript", {"session_id": sid, "entrypoint": "chart.mjs"}))["exit_code"]
            == 0
        )
        svg = ok(await client.call_tool("read_file", {"session_id": sid, "path": "chart.svg"}))
        assert svg["content"].startswith("<svg") and svg["image_type"] is None
        png = await client.call_tool("read_file", {"session_id": sid, "path": "chart.png", "encoding": "base64"})
        assert ok(png)["image_type"] == "image/png"
        image = png.content[1]
        assert isinstance(image, ImageContent) and image.mime_type == "image/png"
        assert png_chunks(base64.b64decode(image.data)) == [b"IHDR", b"IDAT", b"IEND"]
        cut = await client.call_tool(
            "read_file", {"session_id": sid, "path": "chart.png", "encoding": "base64", "max_bytes": 100}
        )
        assert ok(cut)["truncated"] is True and ok(cut)["image_type"] is None and len(cut.content) == 1

        bad = [{"path": "x.bin", "content": "not base64!" + SECRET, "encoding": "base64"}]
        refused = await client.call_tool("write_files", {"session_id": sid, "files": bad})
        assert error_code(refused) == "INVALID_REQUEST"
        text = refused.content[0]
        assert isinstance(text, TextContent) and "files.0" in text.text and "base64" in text.text
        assert SECRET not in str(refused.content)
        one_shot = {
            "files": [
                {"path": "b.bin", "content": "AAEC", "encoding": "base64"},
                {"path": "m.js", "content": "console.log([...require('fs').readFileSync('b.bin')])"},
            ],
            "entrypoint": "m.js",
        }
        assert ok(await client.call_tool("execute_javascript", one_shot))["stdout"] == "[ 0, 1, 2 ]\n"
    audit = (tmp_path / "state" / "audit.jsonl").read_text()
    written = next(json.loads(line) for line in audit.splitlines() if json.loads(line)["tool"] == "write_files")
    assert written["bytes"] == len(payload) + len(files[1]["content"]) + len(CHART.encode())  # decoded bytes
    assert base64.b64encode(payload[:30]).decode() not in audit and "AAEC" not in audit  # never content


async def test_a_run_result_says_what_cpu_time_and_memory_the_run_used(tmp_path: Path, engine: DockerEngine) -> None:
    busy = "const cpu = () => { const u = process.cpuUsage(); return u.user + u.system; }; while (cpu() < 1e6);"
    hold = "const held = Buffer.alloc(200e6, 1); setTimeout(() => console.log(held.length), 500);"
    async with connect(engine, tmp_path) as client:
        results = [
            ok(
                await client.call_tool(
                    "execute_javascript", {"files": [{"path": "p.js", "content": source}], "entrypoint": "p.js"}
                )
            )
            for source in (busy, hold, "console.log('hello')")
        ]
    assert results[0]["cpu_ms"] >= 800
    assert results[1]["peak_memory_bytes"] >= 200_000_000
    assert results[2]["peak_memory_bytes"] < 100_000_000 and results[2]["stdout"] == "hello\n"


async def test_progress_carries_the_last_output_line_at_most_once_a_second(
    tmp_path: Path, engine: DockerEngine
) -> None:
    received: list[tuple[float, str]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        del progress, total
        received.append((time.monotonic(), message or ""))

    ticker = (
        "let i = 0;"
        "const t = setInterval(() => { console.log(`tick ${++i}\\u001b[0m`); if (i === 6) clearInterval(t); }, 500);"
    )
    async with connect(engine, tmp_path) as client:
        files = [{"path": "tick.js", "content": ticker}]
        run = ok(
            await client.call_tool(
                "execute_javascript", {"files": files, "entrypoint": "tick.js"}, progress_callback=on_progress
            )
        )
    assert run["stdout"] == "".join(f"tick {i}\x1b[0m\n" for i in range(1, 7))  # the result itself is unchanged
    quoted = [message for _at, message in received if "; last stdout line: tick " in message]
    assert len(quoted) >= 2, received
    assert all("\x1b" not in message for _at, message in received)  # control characters removed
    gaps = [later - earlier for (earlier, _m), (later, _n) in itertools.pairwise(received)]
    assert all(gap >= 0.8 for gap in gaps), gaps


class StreamFlags(ChannelTransport):
    """The channel transport, recording whether each one-shot asked the runner to stream its output."""

    def __init__(self, engine: Engine, profile: Profile) -> None:
        super().__init__(engine, profile)
        self.streams: list[bool] = []

    def execute(
        self,
        target: Target,
        request: ExecuteRequest,
        *,
        payload: Iterable[bytes],
        timeout: float,
        on_stderr: StderrSink | None = None,
    ) -> ExecuteAnswer | Refusal:
        self.streams.append(request.run.stream)
        return super().execute(target, request, payload=payload, timeout=timeout, on_stderr=on_stderr)


async def test_without_a_progress_token_a_run_streams_nothing(tmp_path: Path, engine: DockerEngine) -> None:
    server = make_server(engine, tmp_path)
    recorder = StreamFlags(server.engine, server.profile)
    install(server.manager, recorder)

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        del progress, total, message

    async with Client(server, mode="legacy") as client:
        arguments = {"files": [{"path": "a.js", "content": "console.log(1)"}], "entrypoint": "a.js"}
        ok(await client.call_tool("execute_javascript", arguments))
        ok(await client.call_tool("execute_javascript", arguments, progress_callback=on_progress))
    assert recorder.streams == [False, True]


# -- the process: stdio, stdout, exit, signals, sweeps ----------------------------------------------------------

NOISY = """
console.log('to stdout'); console.error('to stderr');
let i = 0;
const t = setInterval(() => { console.log('line', i); console.error('err', i); if (++i > 12) clearInterval(t); }, 100);
"""


async def test_the_servers_stdout_carries_only_json_rpc_while_it_runs_logs_and_fails(
    tmp_path: Path, engine: DockerEngine
) -> None:
    # The tee copies every byte the server writes to stdout; --verbose sends every log record (to stderr).
    capture = tmp_path / "stdout.bin"
    params = StdioServerParameters(
        command=sys.executable, args=[TEE, str(capture), CLI, "serve", "--verbose"], env=server_env(tmp_path)
    )
    updates: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        del total, message
        updates.append(progress)

    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        await client.initialize()
        assert len((await client.list_tools()).tools) == 11
        noisy = {"files": [{"path": "noisy.js", "content": NOISY}], "entrypoint": "noisy.js"}
        run = ok(await client.call_tool("execute_javascript", noisy, progress_callback=on_progress))
        assert run["stdout"].startswith("to stdout\n") and run["stderr"].startswith("to stderr\n")
        assert updates, "the run sent no progress notification"
        sid = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        kill = [{"path": "kill.js", "content": "process.kill(process.ppid, 'SIGKILL')"}]
        ok(await client.call_tool("write_files", {"session_id": sid, "files": kill}))
        killed = await client.call_tool("run_javascript", {"session_id": sid, "entrypoint": "kill.js"})
        assert error_code(killed) == "SUPERVISOR_FAILED"  # the server logs it and destroys the sandbox
        assert error_code(await client.call_tool("create_sandbox", {"profile": SECRET})) == "INVALID_REQUEST"
    stdout = capture.read_bytes()
    assert SECRET.encode() not in stdout
    messages = [json.loads(line) for line in stdout.splitlines()]  # each stdout line is JSON
    assert {message["jsonrpc"] for message in messages} == {"2.0"}
    answered = {message["id"] for message in messages if "result" in message}
    assert len(answered) == 7  # initialize, tools/list and five tool calls: every answer came through stdout
    assert any(message.get("method") == "notifications/progress" for message in messages)
    assert worker_containers(engine) == []


def _spawn_server(tmp_path: Path, **settings: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [CLI, "serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=server_env(tmp_path, **settings),
    )


def _initialize_and_create(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    messages: list[dict[str, Any]] = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
         "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "create_sandbox", "arguments": {}}},
    ]  # fmt: skip
    for message in messages:
        proc.stdin.write(json.dumps(message).encode() + b"\n")
        proc.stdin.flush()
    answers = [json.loads(proc.stdout.readline()) for _ in range(2)]
    assert answers[1]["result"]["isError"] is False


@pytest.mark.parametrize("how", ["stdin-eof", "sigterm"])
def test_the_server_removes_its_sandboxes_and_exits_0_on_eof_or_sigterm(
    tmp_path: Path, engine: DockerEngine, how: str
) -> None:
    with _spawn_server(tmp_path, warm_pool="1") as proc:
        _initialize_and_create(proc)
        # The session, and the warm container that refills the pool behind it.
        deadline = time.monotonic() + 30
        while len(worker_containers(engine)) < 2:
            assert time.monotonic() < deadline, "the warm pool did not refill"
            time.sleep(0.1)
        started = time.monotonic()
        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)
        else:
            assert proc.stdin is not None
            proc.stdin.close()
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - started < 10
    assert worker_containers(engine) == []


async def test_a_tagged_servers_start_up_sweep_removes_its_tags_garbage_and_leaves_other_clients_alone(
    tmp_path: Path, engine: DockerEngine, profile: Profile, image_id: str
) -> None:
    watchdog = [*profile.helper_argv("watchdog"), "60"]
    expired = {LABEL_MANAGED: "true", LABEL_EXPIRES_AT: "1"}
    apparmor = engine.daemon_facts().apparmor
    ours = engine.create_container(ContainerRequest(image_id, watchdog, expired, apparmor))
    other_client = DockerEngine(labels={LABEL_TAG: WORKER_TAG + "-other-client"})
    theirs = other_client.create_container(ContainerRequest(image_id, watchdog, expired, apparmor))
    try:
        async with connect(engine, tmp_path) as client:  # the server's engine carries this worker's tag
            with anyio.fail_after(20):
                while await anyio.to_thread.run_sync(engine.container_facts, ours):  # noqa: ASYNC110
                    await anyio.sleep(0.1)
            assert len((await client.list_tools()).tools) == 11
        facts = other_client.container_facts(theirs)
        assert facts is not None and facts.state == "running"  # expired, but another client's to judge
    finally:
        other_client.remove_container(theirs)
        other_client.close()


def test_a_killed_servers_sandbox_is_swept_by_the_next_server_and_a_live_peers_is_kept(
    tmp_path: Path, engine: DockerEngine, profile: Profile, image_id: str
) -> None:
    with _spawn_server(tmp_path) as live, _spawn_server(tmp_path) as doomed:
        _initialize_and_create(live)
        kept = {c.id for c in worker_containers(engine)}
        _initialize_and_create(doomed)
        mine = [c for c in worker_containers(engine) if c.id not in kept]
        assert len(kept) == 1 and len(mine) == 1
        owners = {c.labels[LABEL_OWNER] for c in worker_containers(engine)}
        assert len(owners) == 2  # each server labels its containers with its own liveness marker's token
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=10)
        # Its sandbox ends itself (its lifeline, tests/test_lifelines.py). One that had none (a container made and
        # never started when its server died, or one of an older version) is running and far from its expiry:
        # only the dead marker says it is garbage.
        watchdog = [*profile.helper_argv("watchdog"), "600"]
        labels = {key: value for key, value in mine[0].labels.items() if key != LABEL_TAG}  # the engine adds it
        apparmor = engine.daemon_facts().apparmor
        orphan = {engine.create_container(ContainerRequest(image_id, watchdog, labels, apparmor))}
        with _spawn_server(tmp_path) as next_server:
            assert next_server.stdin is not None
            deadline = time.monotonic() + 20
            while engine.container_facts(next(iter(orphan))) is not None:
                assert time.monotonic() < deadline, "the next server's sweep left the orphan"
                time.sleep(0.1)
            assert {c.id for c in worker_containers(engine)} == kept
            next_server.stdin.close()
            assert next_server.wait(timeout=10) == 0
        assert live.stdin is not None
        live.stdin.close()
        assert live.wait(timeout=10) == 0
    assert worker_containers(engine) == []


async def test_an_unreachable_daemon_at_start_gives_container_unavailable_not_a_crash(tmp_path: Path) -> None:
    settings_env = server_env(tmp_path)
    settings_env["DOCKER_HOST"] = f"unix://{tmp_path}/no-docker.sock"
    params = StdioServerParameters(command=CLI, args=["serve"], env=settings_env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        await client.initialize()
        assert error_code(await client.call_tool("create_sandbox", {})) == "CONTAINER_UNAVAILABLE"
        assert len((await client.list_tools()).tools) == 11


@pytest.fixture
def mcp_inspector() -> Path:
    """The MCP Inspector pinned by tests/support/clients."""
    clients.ensure_installed()
    return clients.launcher()


def _inspector(command: Path, tmp_path: Path, *method: str) -> dict[str, Any]:
    # The Inspector starts the server with a minimal environment of its own: the test's settings (this worker's
    # tag, the audit log and liveness markers under tmp_path) reach it only as -e options.
    env = server_env(tmp_path)
    passed = [
        f"{key}={value}" for key, value in env.items() if key.startswith("CODE_SANDBOX_") or key == "XDG_STATE_HOME"
    ]
    options = [arg for pair in passed for arg in ("-e", pair)]
    completed = subprocess.run(
        [str(command), "--cli", *options, CLI, "serve", "--method", *method],
        capture_output=True, timeout=240, env={**env, "PATH": clients.with_node22(env["PATH"])}, check=False,
        cwd=tmp_path,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-2000:]
    return json.loads(completed.stdout)


def test_an_independent_client_the_mcp_inspector_lists_and_calls_the_tools(
    tmp_path: Path, engine: DockerEngine, mcp_inspector: Path
) -> None:
    listed = _inspector(mcp_inspector, tmp_path, "tools/list")
    assert {tool["name"] for tool in listed["tools"]} >= {"create_sandbox", "destroy_sandbox", "run_javascript"}
    created = _inspector(mcp_inspector, tmp_path, "tools/call", "--tool-name", "create_sandbox")
    assert created["isError"] is False
    session_id = created["structuredContent"]["session_id"]
    # Each inspector call starts its own server; a server removes its sandboxes when its client goes away.
    destroy = ("tools/call", "--tool-name", "destroy_sandbox", "--tool-arg", f"session_id={session_id}")
    destroyed = _inspector(mcp_inspector, tmp_path, *destroy)
    assert destroyed["isError"] is False and destroyed["structuredContent"] == {"destroyed": False}
    assert worker_containers(engine) == []
    # The servers had the test's settings: they wrote the audit log the test named.
    records = [json.loads(line) for line in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()]
    assert [r["tool"] for r in records] == ["create_sandbox", "destroy_sandbox"]


# -- destroy_sandbox: the answer first, the removal after it ------------------------------------------------------


async def test_destroy_answers_before_the_removal_and_the_container_ends_by_itself(
    tmp_path: Path, engine: DockerEngine
) -> None:
    """The reply does not wait for the removal, yet nothing depends on the removal happening: the container is told
    to stop before the reply, so a server that dies right after it (its removal never made) leaves nothing."""
    with HeldRemoval(engine) as held:
        async with connect(held, tmp_path) as client:
            sid = ok(await client.call_tool("create_sandbox", {}))["session_id"]
            (container,) = worker_containers(engine)
            with anyio.fail_after(20):
                assert ok(await client.call_tool("destroy_sandbox", {"session_id": sid})) == {"destroyed": True}
            assert error_code(await client.call_tool("list_files", {"session_id": sid})) == "INVALID_SESSION"
            # The removal is still held, as if this server had died: the container goes on its own.
            await none_of_mine(engine)
            # Its removal was asked (and held); under load the pool may have discarded a warm container too.
            assert held.asked.count(container.id) == 1, held.asked
            assert ok(await client.call_tool("destroy_sandbox", {"session_id": sid})) == {"destroyed": False}


async def test_a_create_at_the_cap_waits_for_a_destroyed_sandbox_still_being_removed(
    tmp_path: Path, engine: DockerEngine
) -> None:
    with HeldRemoval(engine) as held:
        async with connect(held, tmp_path, max_sessions="1") as client:
            sid = ok(await client.call_tool("create_sandbox", {}))["session_id"]
            ok(await client.call_tool("destroy_sandbox", {"session_id": sid}))
            created: list[CallToolResult] = []
            with anyio.fail_after(30):
                async with anyio.create_task_group() as group:

                    async def create() -> None:
                        created.append(await client.call_tool("create_sandbox", {}))

                    group.start_soon(create)
                    while not held.waiting.is_set():  # noqa: ASYNC110 - the removal is in another thread
                        await anyio.sleep(0.02)
                    await anyio.sleep(0.3)
                    assert not created  # it waits for the slot the destroyed sandbox still holds
                    held.released.set()
            assert ok(created[0])["session_id"] != sid


class _Unsignalled(ForwardingEngine):
    """An engine that takes no signal (as one that stopped answering might), and, when told, no removal either."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.refuse_removal = False

    def signal_container(self, container_id: str, signal: str) -> None:
        raise SandboxError(ErrorCode.CONTAINER_UNAVAILABLE, "the sandbox container is not available")

    def remove_container(self, container_id: str) -> bool:
        if self.refuse_removal:
            raise SandboxError(ErrorCode.CONTAINER_REMOVAL_FAILED, "the sandbox container could not be removed")
        return self.inner.remove_container(container_id)


async def test_destroy_removes_the_container_itself_when_the_engine_takes_no_signal(
    tmp_path: Path, engine: DockerEngine
) -> None:
    unsignalled = _Unsignalled(engine)
    async with connect(unsignalled, tmp_path) as client:
        first = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        assert ok(await client.call_tool("destroy_sandbox", {"session_id": first})) == {"destroyed": True}
        assert await anyio.to_thread.run_sync(worker_containers, engine) == []  # removed before the reply
        second = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        unsignalled.refuse_removal = True
        refused = await client.call_tool("destroy_sandbox", {"session_id": second})
        assert error_code(refused) == "CONTAINER_REMOVAL_FAILED"
        assert error_code(await client.call_tool("list_files", {"session_id": second})) == "INVALID_SESSION"
        unsignalled.refuse_removal = False  # the reaper's retry, or shutdown, removes it
    await none_of_mine(engine)


# -- how many sandboxes the engine's memory backs -----------------------------------------------------------------


class _SmallHost(ForwardingEngine):
    """The test's engine, reporting the memory of a small host (a Docker Desktop VM of its default size)."""

    def __init__(self, inner: Engine, memory_bytes: int) -> None:
        super().__init__(inner)
        self.memory_bytes = memory_bytes

    def daemon_facts(self) -> DaemonFacts:
        return replace(self.inner.daemon_facts(), memory_bytes=self.memory_bytes)


def test_the_engine_reports_its_memory_and_it_backs_the_largest_setting(engine: DockerEngine) -> None:
    memory = engine.daemon_facts().memory_bytes
    assert memory > 1024 * MiB  # docker info's MemTotal, read through the answer's model
    # The figure the load benchmark needs: 100 sandboxes on a host of this one's size (24 GiB).
    assert sessions_backed(24 * 1024 * MiB) == 100
    assert sessions_backed(2 * 1024 * MiB) == (2048 - 512 - 256) // 64 == 20
    assert sessions_backed(512 * MiB) == 0


async def test_a_max_sessions_the_engines_memory_cannot_back_is_refused_and_named(
    tmp_path: Path, engine: DockerEngine
) -> None:
    small = _SmallHost(engine, 2 * 1024 * MiB)
    async with connect(small, tmp_path, max_sessions="21") as client:
        refused = await client.call_tool("create_sandbox", {})
        assert error_code(refused) == "SETTINGS_INVALID"
        text = cast(TextContent, refused.content[0]).text
        assert "CODE_SANDBOX_MAX_SESSIONS" in text and "holds 20 sandboxes" in text
        hello = [{"path": "index.js", "content": "console.log('hello')"}]
        refused = await client.call_tool("execute_javascript", {"files": hello, "entrypoint": "index.js"})
        assert error_code(refused) == "SETTINGS_INVALID"
    assert worker_containers(engine) == []
    async with connect(small, tmp_path, max_sessions="20") as client:  # the bound itself is backed
        ok(await client.call_tool("create_sandbox", {}))
    (refusal,) = _capacity_row(small, max_sessions="21")
    assert not refusal.passed
    assert refusal.fix == "set CODE_SANDBOX_MAX_SESSIONS to 20 or less, or give the engine more memory"
    (backed,) = _capacity_row(engine, max_sessions="100")
    assert backed.passed, backed.detail


def _capacity_row(engine: Engine, **settings: str) -> list[Finding]:
    """The ``doctor`` row that judges CODE_SANDBOX_MAX_SESSIONS against ``engine``'s memory."""
    findings: list[Finding] = []
    check_capacity(findings, engine, load_settings({f"CODE_SANDBOX_{k.upper()}": v for k, v in settings.items()}))
    return findings


# -- the tool list's schemas --------------------------------------------------------------------------------------


def _schemas(tool: Tool) -> list[tuple[str, dict[str, Any]]]:
    return [("input", tool.input_schema), *([("output", tool.output_schema)] if tool.output_schema else [])]


def _objects(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The schema and every object schema in its ``$defs``."""
    return [schema, *schema.get("$defs", {}).values()]


async def test_the_tool_list_over_the_wire_has_no_generated_titles_and_every_property_described(
    tmp_path: Path, engine: DockerEngine
) -> None:
    async with connect(engine, tmp_path) as client:
        tools = (await client.list_tools()).tools
    for tool in tools:
        for kind, schema in _schemas(tool):
            assert "title" not in json.dumps(_keywords_only(schema)), (tool.name, kind)
            for obj in _objects(schema):
                for name, prop in obj.get("properties", {}).items():
                    assert prop.get("description"), (tool.name, kind, name)
            assert not _type_lists(schema), (tool.name, kind)  # a strict validator warns of each: anyOf instead
        assert "additionalProperties" not in json.dumps(tool.output_schema), tool.name  # a later field breaks nothing


def _type_lists(node: Any) -> list[Any]:
    """Every ``type`` keyword in a schema whose value is a list (``["integer", "null"]``)."""
    if isinstance(node, list):
        return [found for item in cast(list[Any], node) for found in _type_lists(item)]
    if not isinstance(node, dict):
        return []
    mapping = cast(dict[str, Any], node)
    own = [mapping["type"]] if isinstance(mapping.get("type"), list) else []
    return own + [found for value in mapping.values() for found in _type_lists(value)]


def _keywords_only(node: Any) -> Any:
    """A schema with every property name replaced, so that a property called "title" is not taken for a keyword."""
    if isinstance(node, list):
        return [_keywords_only(item) for item in cast(list[Any], node)]
    if not isinstance(node, dict):
        return node
    mapping = cast(dict[str, Any], node)
    return {
        key: ({f"p{i}": _keywords_only(v) for i, v in enumerate(cast(dict[str, Any], value).values())}
              if key in ("properties", "$defs") and isinstance(value, dict) else _keywords_only(value))
        for key, value in mapping.items()
    }  # fmt: skip


PROBES: list[Any] = [None, True, 0, 1, -1, 3, 43, 121, 10**9, 1.5, "", "a", "utf-8", "base64", "x" * 43, "file",
                     "deleted", [], ["a"], [1], {}, {"path": "a.js", "content": "x"}]  # fmt: skip


def test_the_compact_schemas_accept_and_refuse_what_the_models_schemas_do(profile: Profile) -> None:
    """Titles gone: every property (and every property of a shared definition) still accepts and refuses exactly the
    values the model's own schema does, so no bound the client sees was lost."""
    server = SandboxServer(SandboxService(load_settings({}), profile))
    for tool in server.tool_defs.values():
        for model in (tool.input_model, tool.output_model):
            original = model.model_json_schema()
            compact = compact_schema(original)
            assert len(json.dumps(compact)) < len(json.dumps(original))
            for before, after in zip(_objects(original), _objects(compact), strict=True):
                assert set(before.get("properties", {})) == set(after.get("properties", {}))
                for name, prop in before.get("properties", {}).items():
                    old = Draft202012Validator({"$defs": original.get("$defs", {}), **prop})
                    new = Draft202012Validator({"$defs": compact.get("$defs", {}), **after["properties"][name]})
                    for value in PROBES:
                        verdicts = (old.is_valid(value), new.is_valid(value))  # pyright: ignore[reportUnknownMemberType]
                        assert verdicts[0] == verdicts[1], (tool.name, name, value)


TOOLS_LIST_BUDGET = 23_500
"""Characters of the compact ``tools/list`` result JSON: every client pays for it in every conversation."""


async def test_the_tool_list_fits_its_budget_says_each_fact_once_and_its_annotations_agree_with_its_text(
    tmp_path: Path, engine: DockerEngine
) -> None:
    async with connect(engine, tmp_path) as client:
        listed = await client.list_tools()
    size = len(listed.model_dump_json(by_alias=True, exclude_none=True))
    assert size <= TOOLS_LIST_BUDGET, size
    for tool in listed.tools:
        descriptions = [
            prop["description"]
            for _kind, schema in _schemas(tool)
            for obj in _objects(schema)
            for prop in obj.get("properties", {}).values()
        ]
        repeated = {text for text in descriptions if descriptions.count(text) > 1}
        assert not repeated, (tool.name, repeated)  # a piece used twice is a $def, described once
        text, hints = tool.description or "", tool.annotations
        assert hints is not None
        assert hints.read_only_hint == ("Read-only" in text), tool.name


def test_the_tool_list_fits_its_budget_under_gvisor_too(profile: Profile) -> None:
    """Under gVisor the evaluate tool's text says first that it is refused: the list still fits."""
    server = SandboxServer(SandboxService(load_settings({"CODE_SANDBOX_RUNTIME": "runsc"}), profile))
    tools = [tool.describe() for tool in server.tool_defs.values()]
    size = len(ListToolsResult(tools=tools).model_dump_json(by_alias=True, exclude_none=True))
    assert size <= TOOLS_LIST_BUDGET, size
