"""Privilege and kernel-surface attacks: no capabilities, no new privileges, nothing writable but the tmpfs.

Probes that only read share the worker's sandbox; attempts to write or to drop a binary get sandboxes of their own.
"""

from __future__ import annotations

import json

import pytest

from tests.security.conftest import Arena, SharedSandbox

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]


async def test_every_process_has_zero_capabilities_no_new_privs_and_seccomp(shared: SharedSandbox) -> None:
    source = """
const fs = require('fs'); const rows = [];
for (const p of fs.readdirSync('/proc').filter(p => /^\\d+$/.test(p))) {
  try { const s = fs.readFileSync(`/proc/${p}/status`, 'utf8');
        rows.push(['CapEff', 'CapPrm', 'CapBnd', 'CapAmb', 'NoNewPrivs', 'Seccomp'].map(k => (s.match(new RegExp(k + ':\\\\s*(\\\\w+)')) ?? [])[1] ?? null)); } catch {}
}
console.log(JSON.stringify(rows));
"""
    rows = json.loads((await shared.probe(source)).stdout)
    zero = "0000000000000000"
    if shared.jailed:  # the jail's init (every capability given up) and this program: nothing else can be seen
        assert len(rows) == 2 and all(row[:3] == [zero, zero, zero] and row[3] in (zero, None) for row in rows), rows
        return
    if shared.gvisor:  # no runner lives beside the program; gVisor's kernel applies the engine's filter to itself
        assert len(rows) >= 3  # init, watchdog, supervisor, this program
        assert all(row[:3] == [zero, zero, zero] and row[3] in (zero, None) for row in rows), rows
        return
    assert len(rows) >= 4  # init, watchdog, runner, this program
    assert all(row == [zero, zero, zero, zero, "1", "2"] for row in rows), rows


async def test_system_tools_for_mount_unshare_keyctl_and_ptrace_do_not_exist(shared: SharedSandbox) -> None:
    source = """
const { execFileSync } = require('child_process'); const out = {};
for (const tool of ['/bin/mount', '/usr/bin/unshare', '/bin/sh', '/usr/bin/keyctl', '/usr/bin/gdb', '/usr/bin/strace']) {
  try { execFileSync(tool, ['--help'], { stdio: 'ignore' }); out[tool] = 'ran'; } catch (e) { out[tool] = e.code; }
}
console.log(JSON.stringify(out));
"""
    outcome = json.loads((await shared.probe(source)).stdout)
    assert set(outcome.values()) == {"ENOENT"}


async def test_the_watchdogs_memory_environment_and_fds_are_out_of_reach(shared: SharedSandbox) -> None:
    source = """
const fs = require('fs'); const out = {};
const watchdog = fs.readdirSync('/proc').filter(p => /^\\d+$/.test(p))
  .find(p => fs.readFileSync(`/proc/${p}/cmdline`, 'utf8').includes('watchdog.mjs'));
for (const what of ['mem', 'environ', 'fd/0', 'root/etc/passwd']) {
  try { fs.readFileSync(`/proc/${watchdog}/${what}`); out[what] = 'read'; } catch (e) { out[what] = e.code; }
}
try { fs.readFileSync('/proc/1/environ'); out.init_environ = 'read'; } catch (e) { out.init_environ = e.code; }
out.found = watchdog !== undefined;
console.log(JSON.stringify(out));
"""
    outcome = json.loads((await shared.probe(source)).stdout)
    if shared.jailed:  # a jailed run's /proc lists its own namespace: the watchdog has no pid there
        assert outcome["found"] is False, outcome
        return
    del outcome["found"]
    if shared.gvisor:
        # gVisor's kernel lets another uid read a process's environment (the fixed one, nothing else) and open its
        # /dev/null; its memory, its files and every pipe it holds stay out of reach, and it cannot be signalled.
        assert outcome["mem"] in ("EACCES", "EPERM") and outcome["root/etc/passwd"] in ("EACCES", "EPERM"), outcome
        return
    assert set(outcome.values()) <= {"EACCES", "EPERM"}, outcome


async def test_the_root_filesystem_and_node_binary_cannot_be_written(arena: Arena) -> None:
    source = """
const fs = require('fs'); const out = {};
for (const target of ['/usr/local/bin/node', '/opt/sandbox/runner.mjs', '/etc/passwd', '/new-file', '/proc/sys/kernel/hostname']) {
  try { fs.appendFileSync(target, 'x'); out[target] = 'written'; } catch (e) { out[target] = e.code; }
}
try { fs.chmodSync('/usr/local/bin/node', 0o777); out.chmod = 'changed'; } catch (e) { out.chmod = e.code; }
console.log(JSON.stringify(out));
"""
    outcome = json.loads((await arena.attack(source)).stdout)
    assert set(outcome.values()) <= {"EROFS", "EACCES", "EPERM"}, outcome
    await arena.assert_bystander_unaffected()


@pytest.mark.parametrize("directory", ["/workspace", "/tmp"])
async def test_a_binary_dropped_in_a_tmpfs_cannot_be_executed(arena: Arena, directory: str) -> None:
    # libc is a real ELF executable that the sandbox may read (the loader and the runtime it may not); copied to a
    # noexec tmpfs it must not run.
    source = f"""
const fs = require('fs'); const {{ execFileSync }} = require('child_process');
fs.copyFileSync('/lib/x86_64-linux-gnu/libc.so.6', '{directory}/dropped'); fs.chmodSync('{directory}/dropped', 0o755);
try {{ execFileSync('{directory}/dropped', ['--help'], {{ stdio: 'ignore' }}); console.log('ran'); }}
catch (e) {{ console.log(e.code); }}
"""
    assert (await arena.attack(source)).stdout.strip() == "EACCES"
    await arena.assert_bystander_unaffected()


async def test_no_docker_socket_and_exactly_the_fixed_environment(shared: SharedSandbox) -> None:
    source = """
const fs = require('fs');
const sockets = ['/var/run/docker.sock', '/run/docker.sock', '/run/containerd/containerd.sock', '/run/podman/podman.sock']
  .filter(p => fs.existsSync(p));
console.log(JSON.stringify({ env: process.env, sockets }));
"""
    outcome = json.loads((await shared.probe(source)).stdout)
    assert outcome["sockets"] == []
    fixed = {"PATH": "/usr/local/bin", "HOME": "/workspace", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
    if shared.jailed:  # the readable runtime first on PATH: the jail passes nothing else on
        fixed |= {"PATH": "/usr/local/gvisor:/usr/local/bin"}
    elif shared.gvisor:  # the readable runtime first on PATH, and the helpers told that no seal can hold
        fixed |= {"PATH": "/usr/local/gvisor:/usr/local/bin", "CODE_SANDBOX_SEAL": "optional"}
        fixed |= {"HOSTNAME": "sandbox"}  # runsc sets it for every process, as the container's hostname
    assert outcome["env"] == fixed


async def test_the_hostname_does_not_reveal_the_container_id(shared: SharedSandbox) -> None:
    result = await shared.probe("console.log(require('os').hostname())")
    assert result.stdout == "sandbox\n"
    assert shared.session.container_id[:12] not in result.stdout
