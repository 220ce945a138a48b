"""Resource attacks: each is contained by a limit, and the other sandbox and the host do not notice."""

from __future__ import annotations

import json
import resource
import time

import pytest
from code_sandbox.errors import ErrorCode, SandboxError

from tests.security.conftest import Arena
from tests.support.inspect import inspect_container, memory_usage, oom_events

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]
MiB = 1024 * 1024


async def test_a_child_process_fork_bomb_stops_at_the_pid_limit(arena: Arena) -> None:
    source = """
const { spawn } = require('child_process');
let spawned = 0, refused = 0;
function bomb() {
  try { const c = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], { stdio: 'ignore' });
        c.on('error', () => refused++); c.on('spawn', () => spawned++); }
  catch { refused++; }
}
function tasks() {  // under gVisor, the sandbox uid's (its limit is RLIMIT_NPROC, the uid's own)
  const fs = require('fs'); let n = 0;
  for (const p of fs.readdirSync('/proc').filter(p => /^\\d+$/.test(p)))
    try { const s = fs.readFileSync(`/proc/${p}/status`, 'utf8');
          if (OWN_ONLY && +s.match(/Uid:\\s+(\\d+)/)[1] !== process.getuid()) continue;
          n += +s.match(/Threads:\\s+(\\d+)/)[1]; } catch {}
  return n;
}
let peak = 0;
const t = setInterval(() => { for (let i = 0; i < 20; i++) bomb(); peak = Math.max(peak, tasks()); }, 20);
setTimeout(() => { clearInterval(t); console.log(JSON.stringify({ spawned, refused, peak })); process.exit(0); }, 4000);
"""
    try:
        result = await arena.attack(f"const OWN_ONLY = {str(arena.gvisor).lower()};\n" + source, timeout=20)
    except SandboxError as error:
        # Under gVisor the leftovers are ended by a kill-all exec of the sandbox uid, which cannot start while they
        # hold every task the uid may have: the survey then finds them, and the sandbox goes with them.
        assert arena.gvisor and error.code == ErrorCode.PROCESS_CLEANUP_FAILED, error
        await arena.assert_bystander_unaffected()
        return
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    assert counts["refused"] > 0  # the PID limit (under gVisor, the uid's RLIMIT_NPROC), not the host, said no
    assert counts["peak"] <= 128  # tasks (processes and threads) in the container never passed the limit
    await arena.assert_bystander_unaffected()


async def test_a_worker_threads_bomb_stops_at_the_pid_limit(arena: Arena) -> None:
    # Threads count against the 128 tasks. A worker costs about 9 MiB, so workers alone meet the memory limit first
    # (the worker-isolates memory bomb below); libuv's thread pool, widened to 80 threads, brings the bomb to the PID
    # limit with memory to spare. The cgroup's pids.events counts the forks and clones the PID limit refused.
    source = """
process.env.UV_THREADPOOL_SIZE = '80';  // read when the pool starts, at the first fs call below
const { Worker } = require('worker_threads'); const fs = require('fs');
const threads = () => +fs.readFileSync('/proc/self/status', 'utf8').match(/Threads:\\s+(\\d+)/)[1];
const pidLimitHits = () => {
  for (const p of ['/sys/fs/cgroup/pids.events', '/sys/fs/cgroup/pids/pids.events'])
    try { return +fs.readFileSync(p, 'utf8').match(/max (\\d+)/)[1]; } catch {}
  return NaN;
};
const hitsBefore = pidLimitHits();
fs.readFile('/proc/self/status', () => {
  const pool = threads(); let made = 0, refused = 0, peak = 0; const other = [];
  const refuse = e => e.code === 'ERR_WORKER_INIT_FAILED' ? refused++ : other.push(e.code);
  const report = () => {
    console.log(JSON.stringify({ pool, refused, other, peak, hits: pidLimitHits() - hitsBefore }));
    process.exit(0);
  };
  setInterval(() => {
    for (let i = 0; i < 10 && made < 400; i++, made++)
      try { new Worker('setInterval(() => {}, 1000)', { eval: true }).on('error', refuse); } catch (e) { refuse(e); }
    peak = Math.max(peak, threads());
    if (refused >= 50) report();  // well past the limit
  }, 20);
  setTimeout(report, 5000);
});
"""
    result = await arena.attack(source, timeout=30)
    assert (result.exit_code, result.oom_killed) == (0, False), result.stderr[-2000:]
    counts = json.loads(result.stdout)
    assert counts["pool"] > 80  # the pool's threads are tasks too
    assert counts["refused"] > 0 and counts["other"] == [], counts  # thread creation was refused, nothing else failed
    if not arena.gvisor:  # gVisor shows no cgroup files: its kernel refused them (RLIMIT_NPROC of the uid)
        assert counts["hits"] >= counts["refused"], counts  # ... by the container's PID limit
    assert counts["peak"] <= 128, counts
    await arena.assert_bystander_unaffected()


@pytest.mark.parametrize(
    "source",
    [
        "const a = []; for (;;) a.push(new Array(1e6).fill(1.5));",
        "const a = []; for (;;) a.push(Buffer.alloc(64 * 1024 * 1024, 7));",
        # About 9 MiB each: 400 workers meet the memory limit before the PID limit.
        "const { Worker } = require('worker_threads');"
        "for (let i = 0; i < 400; i++) try { new Worker('setInterval(() => {}, 1000)', { eval: true }); } catch {}"
        "setInterval(() => {}, 1000);",
    ],
    ids=["heap", "off-heap-buffers", "worker-isolates"],
)
async def test_memory_bombs_end_at_the_memory_limit_without_swap(arena: Arena, source: str) -> None:
    inspect = inspect_container(arena.manager.provisioner.engine, arena.victim.container_id)["HostConfig"]
    assert inspect["Memory"] == inspect["MemorySwap"] == 512 * MiB
    try:
        result = await arena.attack(source, timeout=40)
    except SandboxError as error:
        # gVisor's kernel holds the sandbox's memory as one host process: past the limit the host's OOM killer ends
        # it, and the sandbox with it (its container is gone, and with it every process of the bomb).
        assert arena.gvisor and error.code == ErrorCode.CONTAINER_UNAVAILABLE, error
        assert len(arena.manager) == 1  # the bystander
        await arena.assert_bystander_unaffected()
        return
    assert result.exit_code != 0
    assert result.oom_killed or result.signal in ("SIGABRT", "SIGTRAP", "SIGKILL") or result.exit_code in (134, 137)
    await arena.assert_bystander_unaffected()


OOM_LOOP = """
const cp = require('child_process');
function again() {
  const child = cp.spawn(process.execPath, ['-e', 'const a = []; for (;;) a.push(Buffer.allocUnsafeSlow(256 << 20).fill(1))'],
                         { stdio: 'ignore' });
  child.on('exit', again);
}
for (let i = 0; i < 4; i++) again();
"""


@pytest.mark.runc_only("under gVisor the first OOM kill ends gVisor's kernel, and the sandbox with it")
async def test_a_sandbox_that_runs_out_of_memory_again_and_again_ends_before_the_engine_writes_much(
    arena: Arena,
) -> None:
    # Each OOM kill makes dockerd rewrite the container's config.v2.json and hostconfig.json on the host's disk (about
    # 0.6 MB measured per kill); 500 kills in 20 s wrote 13-21 MB. The watchdog ends the sandbox after 16.
    engine = arena.manager.provisioner.engine
    since = int(time.time()) - 1
    started = time.monotonic()
    with pytest.raises(SandboxError) as ended:
        await arena.attack(OOM_LOOP, timeout=60)
    assert time.monotonic() - started < 40  # well before the run's own deadline
    assert ended.value.code in (ErrorCode.CONTAINER_UNAVAILABLE, ErrorCode.SUPERVISOR_FAILED), ended.value
    ooms = oom_events(engine, arena.victim.container_id, since=since, until=int(time.time()) + 1)
    # 16 kills, and what half a second of polling lets past them. The engine sees several OOM events per kill (one
    # each time a process meets the limit while the last victim is still dying), each one a rewrite: 50 to 136 were
    # seen for 16 kills (about 20 MB written), where the loop went on for the run's whole minute before.
    assert 16 <= ooms <= 250, ooms
    await arena.assert_bystander_unaffected()


@pytest.mark.parametrize("directory", ["/workspace", "/tmp"])
async def test_filling_a_tmpfs_hits_enospc_at_64_mib(arena: Arena, directory: str) -> None:
    source = f"""
const fs = require('fs'); let written = 0, code = null;
const chunk = Buffer.alloc(1024 * 1024, 1);
try {{ const fd = fs.openSync('{directory}/fill.bin', 'w'); for (;;) {{ fs.writeSync(fd, chunk); written += chunk.length; }} }}
catch (e) {{ code = e.code; }}
console.log(JSON.stringify({{ written, code }}));
"""
    result = await arena.attack(source)
    outcome = json.loads(result.stdout)
    assert outcome["code"] == "ENOSPC"
    assert outcome["written"] <= 64 * MiB
    await arena.assert_bystander_unaffected()


@pytest.mark.parametrize(
    "source",
    ["for (;;) {}", "Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0);"],
    ids=["busy-loop", "atomics-wait-hang"],
)
async def test_busy_and_idle_hangs_are_killed_at_the_deadline(arena: Arena, source: str) -> None:
    seconds, control_seconds, result = await arena.timed_attack(source, timeout=2)
    assert (result.timed_out, result.termination_reason) == (True, "timed_out")
    assert 1900 <= result.duration_ms < 3500, result.duration_ms  # killed at its deadline, as the runner saw it
    assert seconds < control_seconds + 2 + 2, (seconds, control_seconds)  # and the host's answer followed at once
    await arena.assert_bystander_unaffected()


@pytest.mark.parametrize(
    "source",
    [
        "const s = 'y'.repeat(1 << 20); for (let i = 0; i < 50; i++) process.stdout.write(s);",
        "const s = Buffer.alloc(1 << 20, 0x41); for (let i = 0; i < 50; i++) process.stderr.write(s);",
        "const fs = require('fs'); for (;;) fs.writeSync(1, 'flood flood flood flood flood\\n');",
    ],
    ids=["50-MB-line-stdout", "50-MB-line-stderr", "endless-lines"],
)
async def test_output_floods_are_capped_and_host_memory_stays_bounded(arena: Arena, source: str) -> None:
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = await arena.attack(source, timeout=20)
    assert result.termination_reason == "OUTPUT_LIMIT_EXCEEDED"
    assert len(result.stdout.encode()) <= MiB and len(result.stderr.encode()) <= MiB
    assert result.stdout_truncated or result.stderr_truncated
    # ru_maxrss is in KiB: the host held at most a few copies of the 1 MiB cap, not the 50 MB flood.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 40 * 1024
    await arena.assert_bystander_unaffected()


async def test_exhausting_file_descriptors_hits_emfile(arena: Arena) -> None:
    source = """
const fs = require('fs'); let opened = 0, code = null;
try { for (;;) { fs.openSync('/proc/self/status', 'r'); opened++; } } catch (e) { code = e.code; }
console.log(JSON.stringify({ opened, code }));
"""
    outcome = json.loads((await arena.attack(source)).stdout)
    assert outcome["code"] == "EMFILE" and outcome["opened"] < 1024
    await arena.assert_bystander_unaffected()


async def test_writes_to_pid_1_stdout_are_refused_and_nothing_reaches_the_daemon_log(arena: Arena) -> None:
    source = """
const fs = require('fs'); const out = {};
for (const target of ['/proc/1/fd/1', '/proc/1/fd/2']) {
  try { fs.writeFileSync(target, 'LEAK-TO-DAEMON-LOG\\n'); out[target] = 'written'; } catch (e) { out[target] = e.code; }
}
console.log(JSON.stringify(out));
"""
    outcome = json.loads((await arena.attack(source)).stdout)
    assert set(outcome.values()) <= {"EACCES", "EPERM"}
    host_config = inspect_container(arena.manager.provisioner.engine, arena.victim.container_id)["HostConfig"]
    assert host_config["LogConfig"]["Type"] == "none"  # the daemon keeps no log to reach
    await arena.assert_bystander_unaffected()


async def test_millions_of_empty_files_stop_at_the_tmpfs_inode_limit(arena: Arena) -> None:
    source = """
const fs = require('fs'); let made = 0; let code = 'none';
for (; made < 100000; made++) { try { fs.writeFileSync(`/tmp/f${made}`, ''); } catch (e) { code = e.code; break; } }
console.log(JSON.stringify({ made, code }));
"""
    engine, victim = arena.manager.provisioner.engine, arena.victim.container_id
    before = memory_usage(engine, victim)
    outcome = json.loads((await arena.attack(source, timeout=60)).stdout)
    if arena.gvisor:
        # gVisor's tmpfs takes no inode limit, but it keeps every inode in its kernel's memory, which the sandbox's
        # memory cgroup counts (about 2 KiB a file): the files are bounded by the 512 MiB limit instead.
        assert outcome == {"made": 100000, "code": "none"}, outcome
        assert memory_usage(engine, victim) - before > 100000 * 1024
    else:
        assert outcome["code"] == "ENOSPC" and 8000 <= outcome["made"] < 8192, outcome
    await arena.assert_bystander_unaffected()
