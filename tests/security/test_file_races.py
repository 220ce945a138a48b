"""File API races: user code cannot run while a file operation does, and what it leaves behind is caught."""

from __future__ import annotations

import json

import pytest
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.sandbox.workspace import list_files, write_files

from tests.security.conftest import Arena

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]

SWAPPER = """
const fs = require('fs'), { spawn } = require('child_process');
fs.mkdirSync('/workspace/d', { recursive: true });
// A detached loop that keeps swapping d between a directory and a symlink to /tmp, meant to outlive the run.
spawn(process.execPath, ['-e', `
  const fs = require('fs');
  for (;;) {
    try { fs.renameSync('/workspace/d', '/workspace/d-old'); fs.symlinkSync('/tmp', '/workspace/d'); } catch {}
    try { fs.unlinkSync('/workspace/d'); fs.renameSync('/workspace/d-old', '/workspace/d'); } catch {}
  }`], { detached: true, stdio: 'ignore' }).unref();
setTimeout(() => {}, 500);
"""


async def test_a_symlink_swapping_loop_cannot_redirect_a_write_and_is_caught(arena: Arena) -> None:
    await arena.attack(SWAPPER)
    # The run is over, so the runner has killed the swapper; d is now either a real directory or a symlink.
    try:
        statuses = await write_files(arena.manager, arena.victim.id, [("d/f.txt", "payload")], overwrite=False)
    except SandboxError as error:
        assert error.code == ErrorCode.WORKSPACE_INTEGRITY
        assert len(arena.manager) == 1  # the victim was destroyed
    else:
        assert statuses == ["written"]
        entries, _ = await list_files(arena.manager, arena.victim.id, ".", recursive=True, max_depth=3)
        assert "d/f.txt" in {e.path for e in entries}
        check = "const fs=require('fs');console.log(JSON.stringify({tmp: fs.readdirSync('/tmp')}))"
        assert "f.txt" not in json.loads((await arena.attack(check, name="check.js")).stdout)["tmp"]
    await arena.assert_bystander_unaffected()


async def test_hard_links_to_files_outside_the_workspace_cannot_be_made(arena: Arena) -> None:
    source = """
const fs = require('fs'); const out = {};
fs.writeFileSync('/tmp/outside', 'x');
for (const [from, to] of [['/tmp/outside', '/workspace/h1'], ['/etc/passwd', '/workspace/h2'],
                          ['/usr/local/bin/node', '/workspace/h3']]) {
  try { fs.linkSync(from, to); out[to] = 'linked'; } catch (e) { out[to] = e.code; }
}
console.log(JSON.stringify(out));
"""
    outcome = json.loads((await arena.attack(source)).stdout)
    assert set(outcome.values()) <= {"EXDEV", "EPERM", "EACCES"}, outcome
    await arena.assert_bystander_unaffected()


async def test_a_hard_link_inside_the_workspace_is_detected_and_destroys_the_session(arena: Arena) -> None:
    await arena.attack("require('fs').writeFileSync('a', 'x'); require('fs').linkSync('a', 'b');")
    with pytest.raises(SandboxError) as caught:
        await list_files(arena.manager, arena.victim.id, ".", recursive=True, max_depth=1)
    assert caught.value.code == ErrorCode.WORKSPACE_INTEGRITY
    await arena.assert_bystander_unaffected()
