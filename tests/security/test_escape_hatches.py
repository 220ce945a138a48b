"""Node's escape hatches may "work" inside the sandbox; none gains network, capabilities or outside writes."""

from __future__ import annotations

import json

import pytest

from tests.security.conftest import Arena

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]

# After the hatch, try what would matter: a write outside /workspace and /tmp, and a connection out.
CONSEQUENCES = """
async function consequences(label) {
  const fs = require('fs'), net = require('net'); const out = { label };
  try { fs.writeFileSync('/etc/escaped', 'x'); out.write = 'WROTE'; } catch (e) { out.write = e.code; }
  out.net = await new Promise(r => { const s = net.connect({ host: '1.1.1.1', port: 443, timeout: 2000 });
    s.on('connect', () => { s.destroy(); r('CONNECTED'); }); s.on('timeout', () => { s.destroy(); r('TIMEOUT'); });
    s.on('error', e => r(e.code)); });
  const caps = fs.readFileSync('/proc/self/status', 'utf8').match(/CapEff:\\s*(\\w+)/)[1];
  out.caps = caps; return out;
}
"""


def assert_contained(outcome: dict[str, str]) -> None:
    assert outcome["write"] in ("EROFS", "EACCES"), outcome
    # EPERM: the seccomp profile allows no socket but AF_UNIX. gVisor ignores it; its netstack says EHOSTUNREACH.
    assert outcome["net"] in ("EPERM", "ENETUNREACH", "EHOSTUNREACH", "EAI_AGAIN"), outcome
    assert outcome["caps"] == "0000000000000000", outcome


@pytest.mark.parametrize(
    ("label", "hatch"),
    [
        ("process.binding", "try { process.binding('fs'); process.binding('spawn_sync'); } catch {}"),
        ("child_process runtime", "require('child_process').execFileSync(process.execPath, ['-e', '1']);"),
        ("vm escape", "require('vm').runInNewContext('this.constructor.constructor(`return process`)()').pid;"),
        ("inspector.open", "try { require('inspector').open(9229, '0.0.0.0'); } catch {}"),
    ],
)
async def test_node_escape_hatches_gain_nothing(arena: Arena, label: str, hatch: str) -> None:
    source = (
        CONSEQUENCES
        + f"{hatch}\nconsequences({json.dumps(label)}).then(o => {{ console.log(JSON.stringify(o)); process.exit(0); }});"
    )
    result = await arena.attack(source, timeout=20)
    assert_contained(json.loads(result.stdout.strip().splitlines()[-1]))
    await arena.assert_bystander_unaffected()


async def test_wasi_with_the_root_preopened_cannot_write_outside_the_tmpfs(arena: Arena) -> None:
    # A WASI module is not needed to show the preopen's reach: the preopen maps to the same read-only root
    # the process already sees, so the host-side write test is the same; the WASI constructor must not fail open.
    source = (
        CONSEQUENCES
        + """
let wasi = 'unavailable';
try { const { WASI } = require('wasi'); new WASI({ version: 'preview1', preopens: { '/': '/' } }); wasi = 'constructed'; }
catch (e) { wasi = e.code || 'refused'; }
consequences('wasi').then(o => { o.wasi = wasi; console.log(JSON.stringify(o)); });
"""
    )
    outcome = json.loads((await arena.attack(source)).stdout.strip().splitlines()[-1])
    assert_contained(outcome)
    await arena.assert_bystander_unaffected()


# Every file the sandbox uid may execute (access X_OK fails on the noexec tmpfs mounts), run and stopped at once; then
# its memory opened for writing from its parent, user code of the same uid. A readable binary makes a dumpable process,
# whose /proc/<pid>/mem the parent could open and write native code into (the memory of a process that execs an
# unreadable one is root's to open); the program's own memory is tried too.
DUMPABLE = """
const fs = require('fs'), path = require('path'), cp = require('child_process');
const runnable = [];
(function walk(dir) {
  for (const name of fs.readdirSync(dir)) {
    const full = path.join(dir, name);
    if (['/proc', '/sys', '/dev'].includes(full)) continue;
    let st; try { st = fs.lstatSync(full); } catch { continue; }
    if (st.isDirectory()) { try { walk(full); } catch {} continue; }
    if (!st.isFile()) continue;
    try { fs.accessSync(full, fs.constants.X_OK); runnable.push(full); } catch {}
  }
})('/');
function openMem(pid) {
  try { fs.closeSync(fs.openSync(`/proc/${pid}/mem`, 'r+')); return 'OPENED'; } catch (e) { return e.code; }
}
(async () => {
  const out = { self: openMem('self'), runnable: runnable.length, opened: [] };
  for (const file of runnable) {
    const child = cp.spawn(file, [], { stdio: 'ignore' });
    const spawned = await new Promise(r => child.on('spawn', () => r(true)).on('error', () => r(false)));
    if (!spawned) continue;
    try { process.kill(child.pid, 'SIGSTOP'); } catch {}
    if (openMem(child.pid) === 'OPENED') out.opened.push(file);
    try { process.kill(child.pid, 'SIGKILL'); } catch {}
  }
  console.log(JSON.stringify(out));
})();
"""


async def test_no_program_a_sandbox_can_run_lets_it_write_a_process_memory(arena: Arena) -> None:
    # The image held a readable node copy (for gVisor), a readable dynamic loader and an executable libc: each ran as
    # a dumpable process, into which user code could write raw system calls. Under runc the runtime and the loader
    # are unreadable and the readable copies lie under an empty tmpfs; gVisor's own kernel keeps its copies' memory
    # from user code (the check that holds there is its own).
    result = await arena.attack(DUMPABLE, timeout=30)
    assert result.exit_code == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["runnable"] >= 2, outcome  # node and its loader at least: the walk saw the image
    assert (outcome["self"], outcome["opened"]) == ("EACCES", []), outcome
    await arena.assert_bystander_unaffected()
