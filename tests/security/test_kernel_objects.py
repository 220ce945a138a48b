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
    assert outcome == {"opened": 0, "code": "ENOENT", "pts": [], "made": "EROFS"}
    await arena.assert_bystander_unaffected()


async def test_the_pty_directory_is_an_empty_read_only_tmpfs(shared: SharedSandbox) -> None:
    source = """
const fs = require('fs');
const line = fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\\n').find(l => l.split(' ')[4] === '/dev/pts');
console.log(JSON.stringify(line ? line.split(' - ')[1].split(' ').slice(0, 1).concat(line.split(' ')[5]) : null));
"""
    fstype, options = json.loads((await shared.probe(source)).stdout)
    assert fstype == "tmpfs" and options.split(",")[0] == "ro"
