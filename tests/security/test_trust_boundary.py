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
# line) into every descriptor of its parent (the runner; jailed, the jail's init) that it can name through /proc
# (stdout and stderr where it can list none), and reports what the kernel said; with "kill", SIGKILLs the parent.
FORGE = f"""
const fs = require('fs'); const {{ spawn }} = require('child_process');
spawn(process.execPath, ['-e', "setInterval(() => require('fs').writeFileSync('/workspace/heartbeat', String(Date.now())), 50)"],
      {{ detached: true, stdio: 'ignore' }}).unref();
(function forge() {{
  if (!fs.existsSync('/workspace/heartbeat')) return setTimeout(forge, 20);
  const out = {{}}; let fds;
  try {{ fds = fs.readdirSync(`/proc/${{process.ppid}}/fd`).map(Number); }} catch {{ fds = [1, 2]; }}
  for (const fd of fds) {{
    const text = fd === 2 ? '{{"elapsed_ms":1,"stdout_bytes":1e999,"stderr_bytes":0}}' : {json.dumps(FORGED)};
    try {{ fs.writeFileSync(`/proc/${{process.ppid}}/fd/${{fd}}`, text + '\\n'); out[fd] = 'written'; }} catch (e) {{ out[fd] = e.code; }}
  }}
  console.log(JSON.stringify(out));
  if (process.argv[2] === 'kill') {{
    try {{ process.kill(process.ppid, 'SIGKILL'); }} catch (e) {{ console.log(e.code); }}
  }}
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


async def test_a_forged_runner_answer_is_never_returned_and_nothing_outlives_the_run(
    tmp_path: Path, engine: DockerEngine
) -> None:
    jailed = engine.runtime_in_force().user_space_kernel  # the JavaScript profile's runs are jailed under gVisor
    async with connect(engine, tmp_path) as client:
        sid = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        ok(
            await client.call_tool(
                "write_files", {"session_id": sid, "files": [{"path": "forge.js", "content": FORGE}]}
            )
        )
        # Without killing the runner: the writes are refused, the genuine result comes back, and the heartbeat
        # child was killed with the run (its file no longer changes while another program runs). Jailed, the parent
        # is the jail's init, root's: it holds one descriptor, its status pipe, which the uid may not open.
        run = ok(await client.call_tool("run_javascript", {"session_id": sid, "entrypoint": "forge.js"}))
        written = json.loads(run["stdout"])
        assert written and set(written.values()) == {"EACCES"}, written
        assert jailed or set(written) == {"1", "2"}
        assert run["exit_code"] == 3
        beat = ok(await client.call_tool("read_file", {"session_id": sid, "path": "heartbeat"}))["content"]
        ok(await client.call_tool("write_files", {"session_id": sid, "files": [{"path": "wait.js", "content": WAIT}]}))
        ok(await client.call_tool("run_javascript", {"session_id": sid, "entrypoint": "wait.js"}))
        assert ok(await client.call_tool("read_file", {"session_id": sid, "path": "heartbeat"}))["content"] == beat
        killed = await client.call_tool(
            "run_javascript", {"session_id": sid, "entrypoint": "forge.js", "arguments": ["kill"]}
        )
        if jailed:  # root's init cannot be signalled: the run ends as it chose, and the sandbox lives on
            assert ok(killed)["stdout"].splitlines()[-1] == "EPERM" and ok(killed)["exit_code"] == 3
            assert ok(await client.call_tool("list_files", {"session_id": sid}))["entries"]
            return
        # Killing the runner after the attempt ends the run without an answer: the sandbox is destroyed.
        assert error_code(killed) == "SUPERVISOR_FAILED"
        assert error_code(await client.call_tool("list_files", {"session_id": sid})) == "INVALID_SESSION"
        assert _session_containers(engine, sid) == []  # its container, and every process in it, is gone


INSPECTOR = """
const net = require('net');
try { process.kill(process.ppid, 'SIGUSR1'); process._debugProcess(process.ppid); } catch (e) { console.log(e.code); }
setTimeout(() => {
  const socket = net.connect(9229, '127.0.0.1');
  socket.on('connect', () => { console.log('open'); socket.destroy(); });
  socket.on('error', (e) => console.log(e.code));
}, 700);
"""


async def test_sigusr1_opens_no_inspector_in_the_runner_and_the_run_still_answers(
    tmp_path: Path, engine: DockerEngine
) -> None:
    async with connect(engine, tmp_path) as client:
        sid = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        run = await _run_program(client, sid, INSPECTOR)
    # No inspector: none listens (ECONNREFUSED), and under our seccomp profile no TCP socket can exist at all (EPERM).
    # Jailed (gVisor), the parent is the jail's init, root's: the signal itself is refused.
    signal = "EPERM\n" if engine.runtime_in_force().user_space_kernel else ""
    assert (run["exit_code"], run["stdout"]) in ((0, f"{signal}ECONNREFUSED\n"), (0, f"{signal}EPERM\n"))


REACH = """
const fs = require('fs'); const out = {};
let own = null; try { own = fs.readFileSync('/proc/self/environ', 'latin1'); } catch {}  // runc: not dumpable
const others = fs.readdirSync('/proc').filter(p => /^\\d+$/.test(p) && +p !== process.pid);
for (const p of others) {
  for (const what of ['fd', 'mem', 'environ', 'maps']) {
    try {
      if (what === 'fd') {
        for (const fd of fs.readdirSync(`/proc/${p}/fd`)) {
          for (const flags of ['r', 'a']) {
            try { fs.closeSync(fs.openSync(`/proc/${p}/fd/${fd}`, flags)); out[`${p}/fd/${fd}/${flags}`] = 'open'; }
            catch (e) { out[`${p}/fd/${fd}/${flags}`] = e.code; }
          }
        }
      } else if (what === 'environ') {
        out[`${p}/environ`] = fs.readFileSync(`/proc/${p}/environ`, 'latin1') === own ? 'its own' : 'open';
        continue;
      } else fs.closeSync(fs.openSync(`/proc/${p}/${what}`, 'r'));
      out[`${p}/${what}`] = 'open';
    } catch (e) { out[`${p}/${what}`] = e.code; }
  }
}
console.log(JSON.stringify({ runner: String(process.ppid), others, out, own: fs.readdirSync('/proc/self/fd').length > 0 }));
"""


async def test_user_code_cannot_open_another_processes_fds_or_memory(tmp_path: Path, engine: DockerEngine) -> None:
    async with connect(engine, tmp_path) as client:
        sid = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        seen = json.loads((await _run_program(client, sid, REACH))["stdout"])
    assert seen["own"] is True  # its own fds stay its own
    assert f"{seen['runner']}/fd" in seen["out"]  # its parent was among the targets
    if not engine.runtime_in_force().user_space_kernel:
        # The runner (same uid), the watchdog, the supervisor's exec and init: not one of them opens.
        assert len(seen["out"]) >= 12 and set(seen["out"].values()) <= {"EACCES", "EPERM"}, seen["out"]
        return
    # Jailed (gVisor): the run's own PID namespace shows one process besides its own, the jail's init (root's, pid
    # 1). gVisor lists any process's fd directory and shows its environment and maps to every uid: the init's fd
    # directory holds its status pipe alone, which opens for no uid but root, its environment is the program's own,
    # its maps the jail's published layout, and its memory does not open.
    assert seen["others"] == ["1"] and seen["runner"] == "1", seen
    reached = {k: v for k, v in seen["out"].items() if k not in ("1/fd", "1/maps")}
    descriptors = [k for k in reached if k.startswith("1/fd/")]
    assert len(descriptors) == 2, reached  # one pipe, opened for reading and for writing
    assert reached == {**dict.fromkeys(descriptors, "EACCES"), "1/mem": "EACCES", "1/environ": "its own"}, reached


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
