"""The jail (:mod:`code_sandbox.image.jail`): a program started through it under gVisor sees its own run's processes
and nothing else, is never root, and ends as its program did; a malformed call is refused before the jail asks the
kernel for anything; a privileged exec exists only under a user-space kernel."""

from __future__ import annotations

import json
import platform
import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from code_sandbox.channel.transport import runtime_argv
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.engine import LineRequest
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import SANDBOX_UIDS, ContainerRequest, readable_runtime
from code_sandbox.image.jail import EXIT_USAGE, JAIL_PATH, jail_program
from code_sandbox.profile import Profile

from tests.conftest import WORKER_TAG
from tests.support.runtimes import runtime_engine

# What a jailed program sees: its pids, the fds it can list or open and the signals it can send to every process
# but itself, its ids and capabilities. Then it leaves a detached child behind and exits 7.
PROBE = r"""
const fs = require('fs');
const reach = {};
const pids = fs.readdirSync('/proc').filter((n) => /^[0-9]+$/.test(n)).map(Number).sort((a, b) => a - b);
for (const pid of pids.filter((p) => p !== process.pid)) {
  const r = {};
  try { r.fds = fs.readdirSync(`/proc/${pid}/fd`).length; } catch (e) { r.fds = e.code; }
  try { fs.closeSync(fs.openSync(`/proc/${pid}/mem`, 'r')); r.mem = 'opened'; } catch (e) { r.mem = e.code; }
  try { process.kill(pid, 0); r.signal = 'sent'; } catch (e) { r.signal = e.code; }
  r.opened = [];
  for (const fd of Array.isArray(r.fds) ? [] : [0, 1, 2, 3, 4, 5]) {
    try { fs.closeSync(fs.openSync(`/proc/${pid}/fd/${fd}`, 'r')); r.opened.push(fd); } catch {}
  }
  reach[pid] = r;
}
const status = fs.readFileSync('/proc/self/status', 'utf8');
console.log(JSON.stringify({
  pids, self: process.pid, reach, cwd: process.cwd(), uid: process.getuid(), gid: process.getgid(),
  caps: /CapEff:\s*(\S+)/.exec(status)[1], root: fs.readdirSync('/').sort(),
}));
require('child_process').spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], {
  detached: true, stdio: 'ignore' }).unref();
process.exit(7);
"""

# The supervisor's side, as root with the runtime kernel's every capability: bind once, then jail the probe (whose
# leftover lives on until killed), a program killed by a signal, and one whose jail's group is killed; after each, no
# process of the uid may be left, and after the next run only the container's own proc and that run's are mounted.
SUPERVISOR = r"""
const cp = require('child_process');
const fs = require('fs');
const [jail, uid, node, probe] = process.argv.slice(1);
const env = { PATH: '/usr/local/bin', HOME: '/workspace' };
const owned = new RegExp(`Uid:\\s+${uid}\\s`);
const uidPids = () => fs.readdirSync('/proc').filter((n) => /^[0-9]+$/.test(n)).filter((p) => {
  try { return owned.test(fs.readFileSync(`/proc/${p}/status`, 'utf8')); } catch { return false; }
});
const ofUid = () => uidPids().length;
const settle = () => { for (let i = 0; i < 100 && ofUid() > 0; i++) cp.spawnSync(node, ['-e', '0']); return ofUid(); };
const bound = cp.spawnSync(jail, ['bind']).status;
const probed = cp.spawnSync(jail, ['run', uid, node, '-e', probe], { env, encoding: 'utf8' });
const leftAfterProbe = ofUid(); // the detached child: its namespace lives on for the supervisor to count it
for (const pid of uidPids()) process.kill(Number(pid), 'SIGKILL');
const afterProbe = settle();
const killed = cp.spawnSync(jail, ['run', uid, node, '-e', 'process.kill(process.pid, "SIGTERM")'], { env });
const child = cp.spawn(jail, ['run', uid, node, '-e', 'setInterval(() => {}, 1000)'], {
  env, stdio: 'ignore', detached: true });
setTimeout(() => {
  process.kill(-child.pid, 'SIGKILL'); // the jail's group: the jail and its init, whose end ends the namespace
  child.once('exit', () => {
    const afterKill = settle();
    cp.spawnSync(jail, ['run', uid, node, '-e', '0'], { env }); // takes off the proc the killed jail left mounted
    const mounts = fs.readFileSync('/proc/mounts', 'utf8').split('\n').filter((l) => l.includes(' proc ')).length;
    console.log(JSON.stringify({
      bound, probe: JSON.parse(probed.stdout), probeExit: probed.status, leftAfterProbe, afterProbe,
      killedBy: killed.signal, afterKill, supervisor: process.pid, procMounts: mounts,
    }));
  });
}, 1500);
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the jail is written for x86_64 machines")
@pytest.mark.parametrize(
    "arguments",
    [[], ["bind-me-not"], ["b"], ["runs", "1", "/x"], ["ru", "1", "/x"], ["run"], ["run", "1879048200"],
     ["run", "0", "/x"], ["run", "12a", "/x"], ["run", "", "/x"], ["run", "99999999999", "/x"],
     ["run", "4294967295", "/x"], ["other", "1", "/x"]],
)  # fmt: skip
def test_a_malformed_call_is_refused_before_the_jail_asks_the_kernel_for_anything(
    tmp_path: Path, arguments: list[str]
) -> None:
    jail = tmp_path / "jail"
    program = jail_program("x86_64")
    assert program is not None
    jail.write_bytes(program)
    jail.chmod(0o500)
    done = subprocess.run([str(jail), *arguments], check=False, capture_output=True, timeout=10)
    assert (done.returncode, done.stdout, done.stderr) == (EXIT_USAGE, b"", b"")
    jail.unlink()


@pytest.fixture(scope="module")
def gvisor() -> Iterator[DockerEngine]:
    yield from runtime_engine("runsc", WORKER_TAG + "-jail")


@pytest.fixture
def sandbox(gvisor: DockerEngine, profile: Profile, image_id: str) -> Iterator[tuple[str, int]]:
    """A container made as a sandbox is under gVisor, with nothing of ours started in it but the watchdog."""
    uid = random.choice(SANDBOX_UIDS)  # noqa: S311 - a test's pick, not a secret
    watchdog = runtime_argv(gvisor, profile, [*profile.helper_argv("watchdog"), "600"])
    request = ContainerRequest(image_id, watchdog, {}, gvisor.daemon_facts().apparmor, uid=uid)
    container_id = gvisor.create_container(request)
    try:
        yield container_id, uid
    finally:
        gvisor.remove_container(container_id)


@pytest.mark.docker
def test_a_jailed_program_sees_and_reaches_only_its_own_run_and_ends_as_it_did(
    gvisor: DockerEngine, profile: Profile, sandbox: tuple[str, int]
) -> None:
    container_id, uid = sandbox
    node = readable_runtime(profile.image_spec().runtime_path)
    argv = [node, "-e", SUPERVISOR, JAIL_PATH, str(uid), node, PROBE]
    held = gvisor.open_exec(container_id, argv, user="0:0", privileged=True)
    try:
        report = json.loads(held.read_line(LineRequest(time.monotonic() + 60, max_stdout=65536, max_stderr=65536)))
    finally:
        held.close()
    probe = report["probe"]
    assert report["bound"] == 0 and report["probeExit"] == 7
    # The namespace's init (root, pid 1) and the program: nothing of the container, the supervisor least of all.
    assert probe["pids"] == [1, probe["self"]] and report["supervisor"] not in probe["pids"]
    init = probe["reach"]["1"]
    assert init["fds"] == 1 and init["opened"] == []  # the init keeps one pipe to the jail, which it cannot open
    assert (init["mem"], init["signal"]) == ("EACCES", "EPERM")
    assert (probe["uid"], probe["gid"], probe["caps"]) == (uid, uid, "0000000000000000")
    assert probe["cwd"] == "/workspace" and "usr" in probe["root"]
    assert report["leftAfterProbe"] == 1, "the run's leftover did not live on to be counted"
    assert report["afterProbe"] == 0, "the leftover could not be killed"
    assert report["killedBy"] == "SIGTERM"
    assert report["afterKill"] == 0, "killing the jail's group left its run alive"
    assert report["procMounts"] == 2, "beside the container's own proc, only the last jail's may stay mounted"


@pytest.mark.docker
def test_a_privileged_helper_is_refused_under_the_hosts_kernel(engine: DockerEngine) -> None:
    with pytest.raises(SandboxError) as refused:
        engine.open_exec("not-even-looked-up", ["/nonexistent"], user="0:0", privileged=True)
    assert refused.value.code is ErrorCode.INTERNAL_ERROR
