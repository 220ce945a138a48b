"""Kernel objects a sandbox could hold that its memory cgroup does not count: each is bounded per sandbox, or the
sandbox cannot make it at all (SECURITY.md, "Kernel objects outside the cgroup", names each one's bound and test)."""

from __future__ import annotations

import json

import pytest

from tests.security.conftest import Arena, SharedSandbox

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]


async def test_a_sandbox_cannot_open_a_pty_from_the_hosts_shared_pool(arena: Arena) -> None:
    # Every devpts instance draws on the host's one pool (kernel.pty.max): a sandbox holding 1,000 ptys took a
    # quarter of it. The sandbox has no devpts, so /dev/ptmx (a link into it) leads nowhere.
    source = """
const fs = require('fs'); let opened = 0, code = null;
try { for (let i = 0; i < 64; i++) { fs.openSync('/dev/ptmx', 'r+'); opened++; } } catch (e) { code = e.code; }
let made = null; try { fs.mkdirSync('/dev/pts/x'); made = true; } catch (e) { made = e.code; }
console.log(JSON.stringify({ opened, code, pts: fs.readdirSync('/dev/pts'), made }));
"""
    outcome = json.loads((await arena.attack(source)).stdout)
    if arena.gvisor:
        # gVisor keeps ptys in its own kernel (none comes from the host's pool), and its devpts here is read-only.
        assert outcome["opened"] == 0 and outcome["code"] == "EROFS" and outcome["made"] in ("EROFS", "EACCES")
    else:
        assert outcome == {"opened": 0, "code": "ENOENT", "pts": [], "made": "EROFS"}
    await arena.assert_bystander_unaffected()


async def test_the_pty_directory_is_an_empty_read_only_tmpfs(shared: SharedSandbox) -> None:
    source = """
const fs = require('fs');
const line = fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\\n').find(l => l.split(' ')[4] === '/dev/pts');
console.log(JSON.stringify(line ? line.split(' - ')[1].split(' ').slice(0, 1).concat(line.split(' ')[5]) : null));
"""
    fstype, options = json.loads((await shared.probe(source)).stdout)
    # Under gVisor, its kernel's own devpts, read-only, lies there (it keeps ptys to itself: none is the host's).
    assert fstype == ("devpts" if shared.gvisor else "tmpfs") and options.split(",")[0] == "ro"


@pytest.mark.runc_only(
    "checks our seccomp profile, which gVisor does not apply: its sockets live in its own "
    "kernel, charged to the sandbox (tests/test_engine_only.py)"
)
async def test_no_ip_or_netlink_socket_can_be_made(arena: Arena) -> None:
    # On cgroup v1 no TCP, UDP or netlink buffer is charged to the sandbox (one sandbox pinned 1.75 GiB of TCP and
    # 2.2 GiB of UDP memory, past the host's TCP pressure limit): the seccomp profile allows AF_UNIX sockets alone.
    source = """
const net = require('net'), dgram = require('dgram'), os = require('os');
const code = (fn) => new Promise((done) => { try { fn(done); } catch (e) { done(e.code || e.message); } });
const tcp = (host) => code((done) => net.connect(9, host).on('error', (e) => done(e.code)).on('connect', () => done('OK')));
const listen = (host) => code((done) => net.createServer().on('error', (e) => done(e.code)).listen(0, host, () => done('OK')));
const udp = (type, host) => code((done) => dgram.createSocket(type).on('error', (e) => done(e.code)).bind(0, host, () => done('OK')));
(async () => {
  const out = { tcp4: await tcp('127.0.0.1'), tcp6: await tcp('::1'), listen4: await listen('127.0.0.1'),
                listen6: await listen('::1'), udp4: await udp('udp4', '127.0.0.1'), udp6: await udp('udp6', '::1') };
  try { os.networkInterfaces(); out.netlink = 'OK'; } catch (e) { out.netlink = /error 1\\b/.test(e.message) ? 'EPERM' : e.message; }
  console.log(JSON.stringify(out));
})();
"""
    outcome = json.loads((await arena.attack(source)).stdout)
    assert outcome == dict.fromkeys(["tcp4", "tcp6", "listen4", "listen6", "udp4", "udp6", "netlink"], "EPERM")
    await arena.assert_bystander_unaffected()


@pytest.mark.runc_only(
    "reads the memory cgroup from inside, which gVisor does not show: "
    "tests/test_engine_only.py measures it from the host"
)
async def test_unix_socket_buffers_are_charged_to_the_sandboxs_memory(arena: Arena) -> None:
    # The one socket family left is counted by the cgroup: what 200 connections hold unread shows in its usage.
    source = """
const net = require('net'), fs = require('fs');
const usage = () => { for (const f of ['/sys/fs/cgroup/memory/memory.usage_in_bytes', '/sys/fs/cgroup/memory.current']) {
  try { return Number(fs.readFileSync(f, 'utf8')); } catch {} } return null; };
const held = [], clients = [], chunk = Buffer.alloc(1 << 16, 120);
const server = net.createServer((s) => { s.pause(); held.push(s); }).listen('/tmp/fill.sock', async () => {
  const before = usage();
  for (let i = 0; i < 200; i++) {
    const c = await new Promise((done) => { const c = net.connect('/tmp/fill.sock', () => done(c)); });
    clients.push(c);
    for (let k = 0; k < 64 && c.write(chunk); k++) {}
  }
  await new Promise((done) => setTimeout(done, 1000));
  const queued = clients.reduce((sum, c) => sum + c.bytesWritten - c.writableLength, 0);
  console.log(JSON.stringify({ queued, charged: usage() - before }));
  process.exit(0);
});
"""
    outcome = json.loads((await arena.attack(source, timeout=30)).stdout)
    assert outcome["queued"] > 32 * 1024 * 1024, outcome  # enough to tell from noise
    assert outcome["charged"] > 0.8 * outcome["queued"], outcome
    await arena.assert_bystander_unaffected()


async def test_io_uring_cannot_be_set_up(arena: Arena) -> None:
    # io_uring's operations are no system calls the filter sees, and it is a large kernel surface: libuv asked to use
    # it (UV_USE_IO_URING=1) gets ENOSYS and falls back to its thread pool, holding no ring.
    source = """
const { spawnSync } = require('child_process');
const child = `const fs = require('fs');
fs.writeFileSync('/tmp/ring.txt', 'x'); fs.readFileSync('/tmp/ring.txt');
fs.read(fs.openSync('/tmp/ring.txt'), () => {
  const links = fs.readdirSync('/proc/self/fd').map((fd) => { try { return fs.readlinkSync('/proc/self/fd/' + fd); } catch { return ''; } });
  console.log(JSON.stringify(links.filter((link) => link.includes('io_uring'))));
});`;
const run = spawnSync(process.execPath, ['-e', child], { env: { ...process.env, UV_USE_IO_URING: '1' }, encoding: 'utf8' });
console.log(run.stdout.trim());
"""
    assert json.loads((await arena.attack(source, timeout=30)).stdout) == []
    await arena.assert_bystander_unaffected()
