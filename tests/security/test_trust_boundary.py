"""The in-container trust boundary, attacked over the MCP wire: user code shares a uid with the runner that
supervises it, so it tries to forge the runner's answer, open its inspector, read its fds and memory, outlive
its run, and starve other sandboxes of per-uid kernel resources."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import anyio
import pytest
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.hardening import LABEL_SESSION, SANDBOX_UIDS
from mcp import Client

from tests.test_server import connect, error_code, ok

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("image_id", "cleanup_managed")]

FORGED = '{"ok":true,"exit_code":0,"signal":null,"timed_out":false,"stdout_b64":"","stderr_b64":"","stdout_bytes":0,"stderr_bytes":0,"stdout_truncated":false,"stderr_truncated":false,"oom_killed":false,"oom_detectable":true,"duration_ms":1,"cleanup":"ok","leftover_killed":0,"cpu_ms":0,"peak_memory_bytes":0}'

# Starts a detached heartbeat that would outlive the run, then writes a forged answer (and a poisoned progress
# line) into the runner's stdout and stderr through /proc, and reports what the kernel said.
FORGE = f"""
const fs = require('fs'); const {{ spawn }} = require('child_process');
spawn(process.execPath, ['-e', "setInterval(() => require('fs').writeFileSync('/workspace/heartbeat', String(Date.now())), 50)"],
      {{ detached: true, stdio: 'ignore' }}).unref();
(function forge() {{
  if (!fs.existsSync('/workspace/heartbeat')) return setTimeout(forge, 20);
  const out = {{}};
  for (const [fd, text] of [[1, {json.dumps(FORGED)}], [2, '{{"elapsed_ms":1,"stdout_bytes":1e999,"stderr_bytes":0}}']]) {{
    try {{ fs.writeFileSync(`/proc/${{process.ppid}}/fd/${{fd}}`, text + '\\n'); out[fd] = 'written'; }} catch (e) {{ out[fd] = e.code; }}
  }}
  console.log(JSON.stringify(out));
  if (process.argv[2] === 'kill') process.kill(process.ppid, 'SIGKILL');
  process.exitCode = 3;
}})();
"""


WAIT = "setTimeout(() => {}, 400)"


async def _run_program(client: Client, sid: str, source: str) -> dict[str, Any]:
    """Write ``source`` as main.js in the sandbox and run it; the run's result."""
    ok(await client.call_tool("write_files", {"session_id": sid, "files": [{"path": "main.js", "content": source}]}))
    return ok(await client.call_tool("run_javascript", {"session_id": sid, "entrypoint": "main.js"}))


def _session_containers(engine: DockerEngine, session_id: str) -> list[Any]:
    return engine.list_containers(f"{LABEL_SESSION}={hashlib.sha256(session_id.encode()).hexdigest()[:16]}")


@pytest.mark.runc_only("writes to the runner's fds and kills it; the engine-only model has no runner")
async def test_a_forged_runner_answer_is_never_returned_and_nothing_outlives_the_run(
    tmp_path: Path, engine: DockerEngine
) -> None:
    async with connect(engine, tmp_path) as client:
        sid = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        ok(
            await client.call_tool(
                "write_files", {"session_id": sid, "files": [{"path": "forge.js", "content": FORGE}]}
            )
        )
        # Without killing the runner: the writes are refused, the genuine result comes back, and the heartbeat
        # child was killed with the run (its file no longer changes while another program runs).
        run = ok(await client.call_tool("run_javascript", {"session_id": sid, "entrypoint": "forge.js"}))
        assert json.loads(run["stdout"]) == {"1": "EACCES", "2": "EACCES"}
        assert run["exit_code"] == 3
        beat = ok(await client.call_tool("read_file", {"session_id": sid, "path": "heartbeat"}))["content"]
        ok(await client.call_tool("write_files", {"session_id": sid, "files": [{"path": "wait.js", "content": WAIT}]}))
        ok(await client.call_tool("run_javascript", {"session_id": sid, "entrypoint": "wait.js"}))
        assert ok(await client.call_tool("read_file", {"session_id": sid, "path": "heartbeat"}))["content"] == beat
        # Killing the runner after the attempt ends the run without an answer: the sandbox is destroyed.
        killed = await client.call_tool(
            "run_javascript", {"session_id": sid, "entrypoint": "forge.js", "arguments": ["kill"]}
        )
        assert error_code(killed) == "SUPERVISOR_FAILED"
        assert error_code(await client.call_tool("list_files", {"session_id": sid})) == "INVALID_SESSION"
        assert _session_containers(engine, sid) == []  # its container, and every process in it, is gone


INSPECTOR = """
const net = require('net');
process.kill(process.ppid, 'SIGUSR1'); process._debugProcess(process.ppid);
setTimeout(() => {
  const socket = net.connect(9229, '127.0.0.1');
  socket.on('connect', () => { console.log('open'); socket.destroy(); });
  socket.on('error', (e) => console.log(e.code));
}, 700);
"""


@pytest.mark.runc_only("signals the runner; the engine-only model has no runner")
async def test_sigusr1_opens_no_inspector_in_the_runner_and_the_run_still_answers(
    tmp_path: Path, engine: DockerEngine
) -> None:
    async with connect(engine, tmp_path) as client:
        sid = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        run = await _run_program(client, sid, INSPECTOR)
    # No inspector: none listens (ECONNREFUSED), and under our seccomp profile no TCP socket can exist at all (EPERM).
    assert (run["exit_code"], run["stdout"]) in ((0, "ECONNREFUSED\n"), (0, "EPERM\n"))


REACH = """
const fs = require('fs'); const out = {};
const others = fs.readdirSync('/proc').filter(p => /^\\d+$/.test(p) && +p !== process.pid);
for (const p of others) {
  for (const what of ['fd', 'mem', 'environ', 'maps']) {
    try {
      if (what === 'fd') fs.readdirSync(`/proc/${p}/fd`); else fs.closeSync(fs.openSync(`/proc/${p}/${what}`, 'r'));
      out[`${p}/${what}`] = 'open';
    } catch (e) { out[`${p}/${what}`] = e.code; }
  }
}
console.log(JSON.stringify({ runner: String(process.ppid), out, own: fs.readdirSync('/proc/self/fd').length > 0 }));
"""


@pytest.mark.runc_only(
    "gVisor's kernel does not keep same-uid processes apart, which the engine-only model does not rely on"
)
async def test_user_code_cannot_open_another_processes_fds_or_memory(tmp_path: Path, engine: DockerEngine) -> None:
    async with connect(engine, tmp_path) as client:
        sid = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        seen = json.loads((await _run_program(client, sid, REACH))["stdout"])
    assert seen["own"] is True  # its own fds stay its own
    assert f"{seen['runner']}/fd" in seen["out"]  # the runner, same uid, was among the targets
    assert len(seen["out"]) >= 12 and set(seen["out"].values()) <= {"EACCES", "EPERM"}, seen["out"]


WHOAMI = "const fs = require('fs'); console.log(JSON.stringify([process.getuid(), process.getgid(), fs.statSync('/workspace').uid, fs.statSync('/tmp').uid]))"


async def test_every_live_sandbox_has_its_own_uid_owning_its_tmpfs(tmp_path: Path, engine: DockerEngine) -> None:
    async with connect(engine, tmp_path, max_sessions="4", warm_pool="2") as client:
        uids: list[int] = []
        for _ in range(4):
            sid = ok(await client.call_tool("create_sandbox", {}))["session_id"]
            run = await _run_program(client, sid, WHOAMI)
            uid, gid, workspace, scratch = json.loads(run["stdout"])
            assert uid == gid == workspace == scratch and uid in SANDBOX_UIDS
            uids.append(uid)
    assert len(set(uids)) == 4, uids


# Each attacker opens 45 inotify instances (a worker thread each: an instance belongs to an event loop). Holding all
# of them, it prints "holding" and keeps them until its run is cancelled; short of 45, it prints what it got and ends.
HOLD_INOTIFY = """
const { Worker } = require('worker_threads');
const wanted = 45; const workers = []; const answers = [];
const code = "const fs = require('fs'); const { parentPort } = require('worker_threads');" +
  "try { fs.watch('/tmp', () => {}); parentPort.postMessage('ok'); } catch (e) { parentPort.postMessage(e.code); }";
for (let i = 0; i < wanted; i++) {
  const w = new Worker(code, { eval: true, resourceLimits: { maxOldGenerationSizeMb: 8, maxYoungGenerationSizeMb: 2 } });
  workers.push(w);
  w.on('message', (m) => {
    answers.push(m);
    if (answers.length < wanted) return;
    if (answers.every((a) => a === 'ok')) console.log('holding');
    else { console.log(JSON.stringify({ got: answers.filter((a) => a === 'ok').length, answers })); process.exit(0); }
  });
}
setTimeout(() => process.exit(0), 90000);
"""
HOLDING_BYTES = len(b"holding\n")

# The bystander opens (and closes) a fresh instance in a new worker, ten times, 100 ms apart.
PROBE_INOTIFY = """
const { Worker } = require('worker_threads'); const checks = [];
const code = "const fs = require('fs'); const { parentPort } = require('worker_threads');" +
  "try { fs.watch('/tmp', () => {}).close(); parentPort.postMessage('ok'); } catch (e) { parentPort.postMessage(e.code); }";
(function check() {
  const w = new Worker(code, { eval: true });
  w.once('message', (m) => { checks.push(m); w.terminate().then(() => {
    if (checks.length < 10) setTimeout(check, 100); else console.log(JSON.stringify(checks)); }); });
})();
"""

OUTPUT_BYTES = re.compile(r"(\d+) output bytes")


@pytest.mark.runc_only(
    "the host's per-uid inotify limit it exhausts is not in play: each gVisor sandbox keeps its inotify instances "
    "in a kernel of its own (and 135 workers there outlast the test's bound)"
)
async def test_one_sandbox_exhausting_inotify_instances_does_not_stop_anothers_fs_watch(
    tmp_path: Path, engine: DockerEngine
) -> None:
    # fs.inotify.max_user_instances (128 by default) counts per uid. Three attackers each hold 45 instances, which
    # together exceed it; with a uid per sandbox each attacker gets all of its own and the bystander keeps working.
    # The runs' progress notifications (output bytes) say when an attacker holds all of its instances; the bystander
    # runs once all three do, and they hold them until it is done.
    async with connect(engine, tmp_path, max_sessions="4") as client:
        programs = [HOLD_INOTIFY] * 3 + [PROBE_INOTIFY]
        sids = ["", "", "", ""]

        async def prepare(index: int) -> None:
            sids[index] = ok(await client.call_tool("create_sandbox", {}))["session_id"]
            files = [{"path": "p.js", "content": programs[index]}]
            ok(await client.call_tool("write_files", {"session_id": sids[index], "files": files}))

        async with anyio.create_task_group() as group:
            for index in range(4):
                group.start_soon(prepare, index)

        holding = [anyio.Event() for _ in range(3)]
        ended: list[str | None] = [None, None, None]  # the output of an attacker whose run ended by itself
        checks: list[str] = []

        async def attack(index: int) -> None:
            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                del progress, total
                found = OUTPUT_BYTES.search(message or "")
                if found is not None and int(found[1]) == HOLDING_BYTES:
                    holding[index].set()

            arguments = {"session_id": sids[index], "entrypoint": "p.js", "timeout_seconds": 100}
            result = await client.call_tool("run_javascript", arguments, progress_callback=on_progress)
            ended[index] = ok(result)["stdout"]
            holding[index].set()  # ends the wait below; the assertion after it says what the attacker got

        async with anyio.create_task_group() as group:
            for index in range(3):
                group.start_soon(attack, index)
            with anyio.fail_after(80):
                for event in holding:
                    await event.wait()
            assert ended == [None, None, None], "an attacker could not hold 45 instances"
            probe = {"session_id": sids[3], "entrypoint": "p.js", "timeout_seconds": 30}
            checks = json.loads(ok(await client.call_tool("run_javascript", probe))["stdout"])
            assert ended == [None, None, None], "an attacker let go of its instances before the bystander was done"
            group.cancel_scope.cancel()  # stops the attackers' runs: every process of their uids is killed
    assert checks == ["ok"] * 10, checks
