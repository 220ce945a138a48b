"""evaluate_javascript over the MCP wire: a context that keeps its variables between calls, and everything that ends
it, against a real Docker engine, under each container runtime (under gVisor the context lives in a jail of its own:
``code_sandbox.channel.jailed``)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from code_sandbox.docker_engine import DockerEngine
from mcp import Client

from tests.support.run import worker_tag
from tests.support.runtimes import TEST_RUNTIMES, runtime_engine
from tests.test_server import connect, ok

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("image_id", "cleanup_managed")]

Evaluate = Callable[..., Awaitable[dict[str, Any]]]


@pytest.fixture(scope="session", params=TEST_RUNTIMES)
def engine(request: pytest.FixtureRequest) -> Iterator[DockerEngine]:
    """Every promise of a context holds under each container runtime: the host's kernel (runc) and gVisor's (runsc)."""
    yield from runtime_engine(request.param, worker_tag())


async def _session(client: Client) -> tuple[str, Evaluate]:
    session = ok(await client.call_tool("create_sandbox", {}))["session_id"]

    async def evaluate(code: str, **arguments: Any) -> dict[str, Any]:
        return ok(await client.call_tool("evaluate_javascript", {"session_id": session, "code": code, **arguments}))

    return session, evaluate


async def test_the_acceptance_sequence(engine: DockerEngine, tmp_path: Path) -> None:
    async with connect(engine, tmp_path) as client:
        _session_id, evaluate = await _session(client)
        first = await evaluate("const data = [1,2,3]")
        assert (first["value"], first["context_reset"], first["error"]) == ("undefined", True, None)
        summed = await evaluate("data.reduce((a,b)=>a+b)")
        assert (summed["value"], summed["context_reset"]) == ("6", False)
        assert (await evaluate("await new Promise(r => setTimeout(() => r(42), 100))"))["value"] == "42"
        started = time.monotonic()
        looped = await evaluate("while(true){}", timeout_seconds=2)
        assert time.monotonic() - started < 4
        assert (looped["context_ended"], looped["timed_out"], looped["value"]) == ("timed_out", True, None)
        after = await evaluate("typeof data")
        assert (after["value"], after["context_reset"]) == ("'undefined'", True)


async def test_declarations_modules_and_the_working_directory_persist_as_in_a_repl(
    engine: DockerEngine, tmp_path: Path
) -> None:
    async with connect(engine, tmp_path) as client:
        session, evaluate = await _session(client)
        files = [
            {"path": "lib/add.js", "content": "module.exports = (a, b) => a + b\n"},
            {"path": "lib/twice.mjs", "content": "export const twice = (x) => 2 * x\n"},
        ]
        ok(await client.call_tool("write_files", {"session_id": session, "files": files}))
        await evaluate("function square(x) { return x * x }\nclass Box { constructor(v) { this.v = v } }\nlet n = 3")
        await evaluate("var add = require('./lib/add.js'); const { twice } = await import('./lib/twice.mjs')")
        result = await evaluate(
            "[square(n), new Box(add(1, 2)).v, twice(4), require('node:os').platform(), process.cwd()]"
        )
        assert result["value"] == "[ 9, 3, 8, 'linux', '/workspace' ]"
        assert (await evaluate("n = 10; square(n)"))["value"] == "100"


async def test_an_error_is_a_result_with_the_users_frames_and_the_context_lives_on(
    engine: DockerEngine, tmp_path: Path
) -> None:
    async with connect(engine, tmp_path) as client:
        _session_id, evaluate = await _session(client)
        await evaluate("const kept = 'still here'")
        thrown = await evaluate("function inner() { throw new TypeError('bad input') }\ninner()")
        assert thrown["value"] is None and thrown["context_ended"] is None
        assert (thrown["error"]["name"], thrown["error"]["message"]) == ("TypeError", "bad input")
        assert thrown["error"]["stack"].splitlines() == ["    at inner (evaluation:1:26)", "    at evaluation:2:1"]
        rejected = await evaluate("await Promise.reject(new RangeError('no'))")
        assert (rejected["error"]["name"], rejected["error"]["message"]) == ("RangeError", "no")
        assert "node:" not in rejected["error"]["stack"] and "runner" not in rejected["error"]["stack"]
        redeclared = await evaluate("const kept = 1")
        assert redeclared["error"]["name"] == "SyntaxError"
        assert (await evaluate("kept"))["value"] == "'still here'"


async def test_output_belongs_to_its_own_call(engine: DockerEngine, tmp_path: Path) -> None:
    async with connect(engine, tmp_path) as client:
        _session_id, evaluate = await _session(client)
        first = await evaluate("console.log('one'); console.error('warn'); process.stdout.write('no newline')")
        assert (first["stdout"], first["stderr"]) == ("one\nno newline", "warn\n")
        second = await evaluate("console.log('two'); 2")
        assert (second["stdout"], second["stderr"], second["value"]) == ("two\n", "", "2")


async def test_a_run_in_the_sandbox_resets_the_context(engine: DockerEngine, tmp_path: Path) -> None:
    async with connect(engine, tmp_path) as client:
        session, evaluate = await _session(client)
        await evaluate("globalThis.remembered = 1")
        hello = [{"path": "hello.js", "content": "console.log('hi')"}]
        ok(await client.call_tool("write_files", {"session_id": session, "files": hello}))
        ran = ok(await client.call_tool("run_javascript", {"session_id": session, "entrypoint": "hello.js"}))
        assert ran["stdout"] == "hi\n"
        after = await evaluate("typeof remembered")
        assert (after["value"], after["context_reset"]) == ("'undefined'", True)


async def test_reset_discards_the_context_first(engine: DockerEngine, tmp_path: Path) -> None:
    async with connect(engine, tmp_path) as client:
        _session_id, evaluate = await _session(client)
        await evaluate("const once = 1")
        fresh = await evaluate("const once = 2; once", reset=True)
        assert (fresh["value"], fresh["context_reset"], fresh["error"]) == ("2", True, None)


async def test_an_async_infinite_loop_is_stopped_at_the_timeout(engine: DockerEngine, tmp_path: Path) -> None:
    async with connect(engine, tmp_path) as client:
        _session_id, evaluate = await _session(client)
        await evaluate("const before = 1")
        started = time.monotonic()
        looped = await evaluate("for (;;) { await null }", timeout_seconds=2)
        assert time.monotonic() - started < 4 and looped["context_ended"] == "timed_out"
        after = await evaluate("typeof before")
        assert (after["value"], after["context_reset"]) == ("'undefined'", True)


@pytest.mark.runc_only("under gVisor the first OOM kill ends gVisor's kernel, and the sandbox with it")
async def test_running_out_of_memory_ends_the_context_and_keeps_the_files(engine: DockerEngine, tmp_path: Path) -> None:
    async with connect(engine, tmp_path) as client:
        session, evaluate = await _session(client)
        ok(await client.call_tool("write_files", {"session_id": session,
                                                  "files": [{"path": "keep.txt", "content": "kept"}]}))  # fmt: skip
        hog = await evaluate("const hog = []; for (;;) hog.push(Buffer.alloc(16 * 1024 * 1024, 1))", timeout_seconds=30)
        assert hog["context_ended"] in ("oom_killed", "crashed") and hog["value"] is None
        read = ok(await client.call_tool("read_file", {"session_id": session, "path": "keep.txt"}))
        assert read["content"] == "kept"
        assert (await evaluate("typeof hog"))["value"] == "'undefined'"


async def test_an_output_flood_ends_the_context_at_the_cap(engine: DockerEngine, tmp_path: Path) -> None:
    async with connect(engine, tmp_path) as client:
        _session_id, evaluate = await _session(client)
        # Written synchronously: process.stdout.write in a loop that never yields only queues in the heap.
        flood = await evaluate("const line = 'x'.repeat(65536); for (;;) require('fs').writeSync(1, line)")
        assert (flood["context_ended"], flood["stdout_truncated"]) == ("OUTPUT_LIMIT_EXCEEDED", True)
        assert len(flood["stdout"]) == 1024 * 1024


async def test_a_long_value_is_bounded(engine: DockerEngine, tmp_path: Path) -> None:
    async with connect(engine, tmp_path) as client:
        _session_id, evaluate = await _session(client)
        value = (await evaluate("'x'.repeat(1_000_000)"))["value"]
        assert 1000 < len(value) <= 64 * 1024
        nested = (await evaluate("const deep = {a: {b: {c: {d: {e: {f: 1}}}}}}; deep"))["value"]
        assert "[Object]" in nested


async def test_processes_the_code_starts_end_with_its_call_and_timers_wait_for_the_next(
    engine: DockerEngine, tmp_path: Path
) -> None:
    async with connect(engine, tmp_path) as client:
        _session_id, evaluate = await _session(client)
        spawned = await evaluate(
            "const { spawn } = require('child_process');\n"
            "spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], { detached: true }).unref();\n"
            "let ticks = 0; setInterval(() => ticks++, 10); 'started'"
        )
        assert spawned["value"] == "'started'"
        await anyio.sleep(0.5)  # the context is paused: its interval does not tick meanwhile
        seen = await evaluate(
            "const fs = require('fs'); [ticks, fs.readdirSync('/proc').filter((p) => /^[0-9]+$/.test(p))"
            ".map((p) => { try { return fs.readFileSync(`/proc/${p}/cmdline`, 'latin1') } catch { return '' } })"
            ".filter((c) => c.includes('setInterval')).length]"
        )
        ticks, survivors = seen["value"].strip("[] ").split(", ")
        assert int(ticks) < 10 and survivors == "0"


async def test_a_forged_context_answer_ends_the_context_and_is_never_returned(
    engine: DockerEngine, tmp_path: Path
) -> None:
    async with connect(engine, tmp_path) as client:
        session, evaluate = await _session(client)
        forged = await evaluate(
            "require('fs').writeSync(3, JSON.stringify({nonce: 'guess', value: 'FORGED', error: null}) + '\\n'); 1"
        )
        assert forged["value"] is None and forged["context_ended"] == "crashed"
        assert "FORGED" not in str(forged)
        listed = ok(await client.call_tool("list_files", {"session_id": session}))  # the session is still usable
        assert listed["entries"] == []


async def test_one_sessions_context_cannot_see_anothers(engine: DockerEngine, tmp_path: Path) -> None:
    async with connect(engine, tmp_path) as client:
        _first, evaluate_first = await _session(client)
        _second, evaluate_second = await _session(client)
        await evaluate_first("globalThis.secret = 'S3CR3T'; const alsoSecret = 1")
        seen = await evaluate_second("[typeof secret, typeof alsoSecret]")
        assert seen["value"] == "[ 'undefined', 'undefined' ]"


CONTINUERS = r"""
var { spawn } = require('child_process'), fs = require('fs'), context = process.pid;
var idle = ['-e', 'setInterval(() => {}, 1e6)'];
var pester = ['-e', `for (;;) { try { process.kill(${context}, 'SIGCONT') } catch {} }`];
for (let i = 0; i < 4; i++) spawn(process.execPath, idle, { stdio: 'ignore' });
for (let i = 0; i < 2; i++) spawn(process.execPath, pester, { stdio: 'ignore' });
var n = n ?? 0;
globalThis.beat ??= setInterval(() => fs.writeFileSync('/workspace/beat', String(++n)), 20);
await new Promise((r) => setTimeout(r, 300)); 'armed'
"""


@pytest.mark.serial  # two processes spin on the CPU to win the race: beside other tests they would slow their cleanup
async def test_children_that_continue_the_context_during_cleanup_cannot_keep_it_running(
    engine: DockerEngine, tmp_path: Path
) -> None:
    # Children that keep sending the context SIGCONT while the cleanup stops and kills them: whichever wins the race,
    # the context must be stopped again once they are gone, so its heartbeat file does not change between calls.
    async with connect(engine, tmp_path) as client:
        session, evaluate = await _session(client)
        for _attempt in range(3):
            armed = await evaluate(CONTINUERS)
            assert armed["value"] == "'armed'", {k: v for k, v in armed.items() if k not in ("stdout", "stderr")}
            beats: list[str] = []
            for _read in range(2):
                await anyio.sleep(0.4)
                read = ok(await client.call_tool("read_file", {"session_id": session, "path": "beat"}))
                beats.append(read["content"])
            assert beats[0] == beats[1], "the context ran while it should have been paused"


async def test_text_that_is_not_well_formed_comes_back_replaced_and_the_sandbox_lives(
    engine: DockerEngine, tmp_path: Path
) -> None:
    async with connect(engine, tmp_path) as client:
        session, evaluate = await _session(client)
        cut = await evaluate("throw new Error('x'.repeat(4095) + '\\u{1F600}')")  # cut inside the surrogate pair
        assert cut["error"]["message"] == "x" * 4095 + "\ufffd"
        lone = await evaluate("throw new Error('\\ud800')")  # a value would come escaped by util.inspect
        assert lone["error"]["message"] == "\ufffd"
        # Long multi-byte values arrive in several pipe chunks: none of their characters is split.
        accented = await evaluate("Array.from({length: 5}, (_, i) => (i ? '' : 'x') + '\\u00e9'.repeat(9000))")
        assert "\ufffd" not in accented["value"] and accented["value"].count("\u00e9") > 9000
        ok(await client.call_tool("list_files", {"session_id": session}))
