"""Process attacks: leftovers are killed, zombies reaped, and the watchdog and init cannot be signalled."""

from __future__ import annotations

import json

import pytest
from code_sandbox.sandbox.workspace import write_files

from tests.security.conftest import Arena

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]

# Every other process in the container, once no zombie is left: the processes that the last run's cleanup killed are
# zombies until init reaps them, which on a loaded machine can still be under way when this program starts. A process
# that is still alive does not turn into a zombie meanwhile (nothing here kills it), so the wait hides none; a zombie
# that init leaves for good is still listed when the wait runs out.
SURVEY = """
const fs = require('fs');
function others() {
  const seen = [];
  for (const p of fs.readdirSync('/proc').filter(p => /^\\d+$/.test(p))) {
    try { const s = fs.readFileSync(`/proc/${p}/status`, 'utf8');
          seen.push({ pid: +p, uid: +s.match(/Uid:\\s+(\\d+)/)[1], state: s.match(/State:\\s+(\\w)/)[1] }); } catch {}
  }
  return seen.filter(x => x.pid !== process.pid && x.pid !== process.ppid);
}
const deadline = performance.now() + 5000;
(function look() {
  const seen = others();
  if (seen.some(x => x.state === 'Z') && performance.now() < deadline) setTimeout(look, 20);
  else console.log(JSON.stringify(seen));
})();
"""


@pytest.mark.parametrize(
    "spawn_options",
    [
        "detached: true, stdio: 'inherit'",
        "detached: true, stdio: 'ignore'",
        "detached: false, stdio: 'inherit'",
        "detached: false, stdio: 'ignore'",
    ],
    ids=["setsid-holding-stdout", "setsid-silent", "unref-holding-stdout", "unref-silent"],
)
async def test_detached_children_are_killed_and_the_run_returns_promptly(arena: Arena, spawn_options: str) -> None:
    # Five children that ignore SIGTERM and outlive their parent, in a session of their own or not; holding the run's
    # stdout and stderr open (and writing to them), or not. A runner that waited for them, or for EOF on its pipes,
    # would run into the deadline.
    source = f"""
const {{ spawn }} = require('child_process');
for (let i = 0; i < 5; i++)
  spawn(process.execPath, ['-e', 'process.on("SIGTERM", () => {{}}); setInterval(() => console.log(1), 100)'],
        {{ {spawn_options} }}).unref();
console.log('parent done');
"""
    seconds, control_seconds, result = await arena.timed_attack(source, timeout=10)
    # Under gVisor the leftovers are ended by a kill-all exec (a runtime start there), not by a runner already up.
    slack = 5 if arena.gvisor else 2
    assert seconds < control_seconds + slack, (
        f"the run waited for its children: {seconds:.1f} s, {control_seconds:.1f} s"
    )
    assert (result.exit_code, result.timed_out, result.termination_reason) == (0, False, "exited")
    lines = result.stdout.splitlines(keepends=True)  # the parent's line, and whole lines of whatever children wrote
    assert lines.count("parent done\n") == 1 and set(lines) <= {"parent done\n", "1\n"}, result.stdout
    assert result.leftover_processes_killed >= 5
    processes = json.loads((await arena.attack(SURVEY, name="survey.js")).stdout)
    assert [p for p in processes if p["uid"] == arena.victim.uid] == []
    await arena.assert_bystander_unaffected()


async def test_zombies_are_reaped_by_init(arena: Arena) -> None:
    # Orphaned grandchildren that exit are reparented to the init process, which must reap them.
    source = """
const { spawn } = require('child_process');
const middle = spawn(process.execPath, ['-e', `
  const { spawn } = require('child_process');
  for (let i = 0; i < 10; i++) spawn(process.execPath, ['-e', 'setTimeout(() => {}, 300)'], { detached: true, stdio: 'ignore' }).unref();
  process.exit(0);`], { stdio: 'ignore' });
middle.on('exit', () => setTimeout(() => {}, 1500));
"""
    await arena.attack(source)
    processes = json.loads((await arena.attack(SURVEY, name="survey.js")).stdout)
    assert [p for p in processes if p["state"] == "Z"] == []
    await arena.assert_bystander_unaffected()


async def test_the_watchdog_and_init_cannot_be_signalled(arena: Arena) -> None:
    # Every signal, at every process that is not the sandbox's own uid: docker-init and the watchdog (uid 65533).
    source = """
const fs = require('fs'); const out = { targets: [], results: [] };
for (const p of fs.readdirSync('/proc').filter(p => /^\\d+$/.test(p))) {
  let uid, cmdline;
  try { uid = +fs.readFileSync(`/proc/${p}/status`, 'utf8').match(/Uid:\\s+(\\d+)/)[1];
        cmdline = fs.readFileSync(`/proc/${p}/cmdline`, 'utf8'); } catch { continue; }  // gone meanwhile
  if (uid === process.getuid()) continue;
  out.targets.push({ pid: +p, uid, cmdline });
  for (const sig of ['SIGKILL', 'SIGSTOP', 'SIGTERM', 'SIGHUP', 'SIGUSR2']) {
    try { process.kill(+p, sig); out.results.push(`${p}:${sig}:sent`); } catch (e) { out.results.push(e.code); }
  }
}
console.log(JSON.stringify(out));
"""
    outcome = json.loads((await arena.attack(source)).stdout)
    targets = outcome["targets"]
    assert 1 in [t["pid"] for t in targets], targets
    if arena.jailed:  # the jail's init is pid 1, and nothing of the container can even be named
        assert [(t["pid"], t["uid"]) for t in targets] == [(1, 0)], targets
        assert targets[0]["cmdline"].startswith("/usr/local/gvisor/jail"), targets
    else:
        assert any("watchdog.mjs" in t["cmdline"] and t["uid"] == 65533 for t in targets), targets
    # SIGUSR2 would claim to have been sent, were anything signallable.
    assert len(outcome["results"]) == 5 * len(targets) and set(outcome["results"]) == {"EPERM"}, outcome
    facts = arena.manager.provisioner.engine.container_facts(arena.victim.container_id)
    assert facts is not None and facts.state == "running"
    # Neither stopped nor killed: the victim still runs programs and its file helper still answers.
    assert (await arena.attack("console.log('alive')", name="alive.js")).stdout == "alive\n"
    assert await write_files(arena.manager, arena.victim.id, [("still.txt", "alive")], overwrite=False) == ["written"]
    await arena.assert_bystander_unaffected()
