"""Process attacks: leftovers are killed, zombies reaped, and the watchdog and init cannot be signalled."""

from __future__ import annotations

import json
import time

import pytest

from tests.security.conftest import Arena

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]

SURVEY = """
const fs = require('fs'); const seen = [];
for (const p of fs.readdirSync('/proc').filter(p => /^\\d+$/.test(p))) {
  try { const s = fs.readFileSync(`/proc/${p}/status`, 'utf8');
        seen.push({ pid: +p, uid: +s.match(/Uid:\\s+(\\d+)/)[1], state: s.match(/State:\\s+(\\w)/)[1] }); } catch {}
}
console.log(JSON.stringify(seen.filter(x => x.pid !== process.pid && x.pid !== process.ppid)));
"""


@pytest.mark.parametrize("detach", ["detached: true", "detached: false"], ids=["setsid", "unref"])
async def test_detached_children_are_gone_after_the_run(arena: Arena, detach: str) -> None:
    source = f"""
const {{ spawn }} = require('child_process');
for (let i = 0; i < 5; i++)
  spawn(process.execPath, ['-e', 'process.on("SIGTERM", () => {{}}); setInterval(() => {{}}, 1000)'],
        {{ {detach}, stdio: 'ignore' }}).unref();
"""
    started = time.monotonic()
    result = await arena.attack(source)
    assert time.monotonic() - started < 3 and result.leftover_processes_killed >= 5
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
    source = """
const fs = require('fs'); const out = [];
for (const p of fs.readdirSync('/proc').filter(p => /^\\d+$/.test(p))) {
  const uid = +fs.readFileSync(`/proc/${p}/status`, 'utf8').match(/Uid:\\s+(\\d+)/)[1];
  if (uid === process.getuid()) continue;
  for (const sig of ['SIGKILL', 'SIGSTOP', 'SIGTERM', 'SIGHUP', 'SIGUSR2']) {
    try { process.kill(+p, sig); out.push(`${p}:${sig}:sent`); } catch (e) { out.push(e.code); }
  }
}
console.log(JSON.stringify(out));
"""
    outcome = json.loads((await arena.attack(source)).stdout)
    assert len(outcome) >= 10 and set(outcome) == {"EPERM"}  # pid 1 and the watchdog; SIGUSR2 would claim
    facts = arena.manager.engine.container_facts(arena.victim.container_id)
    assert facts is not None and facts.state == "running"
    await arena.assert_bystander_unaffected()
