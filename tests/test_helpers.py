"""The three in-container helpers, exercised in the real image with the real hardening."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio.to_thread
import pytest
from code_sandbox.engine import DockerEngine
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import PROBE_UID, ContainerRequest, Hardening, user_of
from code_sandbox.helpers import call_helper
from code_sandbox.protocol import InventoryAnswer, Refusal, RunAnswer
from code_sandbox.sessions import Session, SessionManager
from code_sandbox.settings import Settings
from code_sandbox.workspace import digest_file, read_file, write_files

from tests.conftest import TEST_LABEL

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]
MiB = 1024 * 1024


@pytest.fixture
async def manager(engine: DockerEngine, profile: Any, image_id: str) -> AsyncIterator[SessionManager]:
    del image_id
    manager = SessionManager(engine, profile, Settings(max_sessions=4))
    yield manager
    await manager.shutdown()


def run_program(manager: SessionManager, session: Session, source: str, *, timeout_ms: int = 10_000) -> dict[str, Any]:
    """Run JavaScript through the runner helper, as the run tool does."""
    argv = [*manager.profile.helper_argv("runner"), json.dumps(
        {"argv": ["/usr/local/bin/node", "-e", source], "timeout_ms": timeout_ms, "stdout_cap": MiB, "stderr_cap": MiB}
    )]  # fmt: skip
    answer = call_helper(
        manager.engine, session.container_id, argv, user=session.user, answer=RunAnswer, timeout=timeout_ms / 1000 + 10
    )
    return answer.model_dump()


async def test_a_2_mib_file_round_trips_byte_exactly(manager: SessionManager) -> None:
    session = await manager.create()
    text = ("é€😀\tline\r\n" + "".join(chr(c) for c in range(0x20, 0x7F)) + "\x01\x1f\n") * 19_000
    data = text.encode()[: 2 * MiB]
    text = data.decode("utf-8", "ignore")  # a prefix of whole characters, just under 2 MiB
    assert await write_files(manager, session.id, [("deep/dir/big.txt", text)], overwrite=False) == ["written"]
    assert await digest_file(manager, session.id, "deep/dir/big.txt") == hashlib.sha256(text.encode()).hexdigest()
    read = await read_file(manager, session.id, "deep/dir/big.txt", max_bytes=2 * MiB)
    assert read.content == text and read.size == len(text.encode()) and read.truncated is False


@pytest.mark.parametrize(
    "make",
    [
        "fs.symlinkSync('/etc/passwd', '/workspace/link')",
        "fs.writeFileSync('/workspace/a', 'x'); fs.linkSync('/workspace/a', '/workspace/b')",
        "require('net').createServer().listen('/workspace/sock', () => process.exit(0))",
    ],
    ids=["symlink", "hardlink", "socket"],
)
async def test_links_and_special_files_made_by_user_code_destroy_the_session(
    manager: SessionManager, make: str
) -> None:
    session = await manager.create()
    answer = await anyio.to_thread.run_sync(run_program, manager, session, f"const fs = require('fs'); {make}")
    assert answer["ok"] is True
    with pytest.raises(SandboxError) as caught:
        await read_file(manager, session.id, "anything.txt", max_bytes=10)
    assert caught.value.code == ErrorCode.WORKSPACE_INTEGRITY
    assert "destroyed" in caught.value.message
    assert len(manager) == 0


class _NoWorkspaceTmpfs(Hardening):
    """Test-only: leave the image's own /workspace visible, so a FIFO baked into the image sits there."""

    def tmpfs(self, uid: int) -> dict[str, str]:
        return {"/tmp": super().tmpfs(uid)["/tmp"]}


def test_a_fifo_in_the_workspace_is_refused_by_the_file_helper(
    engine: DockerEngine, profile: Any, image_id: str
) -> None:
    # User code cannot make a FIFO here (no mknod in Node, no shell, no binaries), so the FIFO is baked into a
    # derived image and the workspace tmpfs left off; the file helper must still refuse to work.
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        dockerfile = f"FROM {image_id}\nCOPY workspace/ /workspace/\n".encode()
        entry = tarfile.TarInfo("Dockerfile")
        entry.size = len(dockerfile)
        archive.addfile(entry, io.BytesIO(dockerfile))
        fifo = tarfile.TarInfo("workspace/fifo")
        fifo.type = tarfile.FIFOTYPE
        fifo.mode = 0o600
        archive.addfile(fifo)
    buffer.seek(0)
    derived = engine.build_image(buffer, tag="code-sandbox-test-fifo:1", labels={}, on_step=lambda _step: None)
    request = ContainerRequest(
        image_id=derived,
        command=[*profile.helper_argv("watchdog"), "60"],
        labels={TEST_LABEL: "1"},
        apparmor=engine.daemon_facts().apparmor,
        hardening=_NoWorkspaceTmpfs(),
    )
    container_id = engine.create_container(request)
    try:
        argv = [*profile.helper_argv("files"), "inventory", "{}"]
        answer = call_helper(engine, container_id, argv, user=user_of(PROBE_UID), answer=InventoryAnswer, timeout=30)
    finally:
        engine.remove_container(container_id)
        engine.untag_image("code-sandbox-test-fifo:1")
    assert isinstance(answer, Refusal) and answer.code == "WORKSPACE_INTEGRITY"


async def test_a_setsid_grandchild_holding_stdout_is_killed_and_the_run_returns_promptly(
    manager: SessionManager,
) -> None:
    session = await manager.create()
    source = (
        "const {spawn} = require('child_process');"
        "spawn('/usr/local/bin/node', ['-e', 'setInterval(() => {}, 1000)'],"
        " {detached: true, stdio: ['ignore', 'inherit', 'inherit']}).unref();"
        "console.log('parent done');"
    )
    started = time.monotonic()
    answer = await anyio.to_thread.run_sync(run_program, manager, session, source)
    assert time.monotonic() - started < 3
    assert answer["exit_code"] == 0 and answer["cleanup"] == "ok" and answer["leftover_killed"] >= 1
    assert base64.b64decode(answer["stdout_b64"]) == b"parent done\n"
    leftovers = await anyio.to_thread.run_sync(
        run_program, manager, session,
        "const fs=require('fs');console.log(fs.readdirSync('/proc').filter(p=>/^\\d+$/.test(p)&&+p!==process.pid"
        f"&&+p!==process.ppid&&fs.statSync('/proc/'+p).uid==={session.uid}&&!fs.readFileSync('/proc/'+p+'/status','utf8').includes('State:\\tZ')"
        "&&+fs.readFileSync('/proc/'+p+'/stat','utf8').split(' ')[3]!==process.ppid).length)",
    )  # fmt: skip
    assert base64.b64decode(leftovers["stdout_b64"]).strip() == b"0"


async def test_user_code_cannot_kill_or_stop_the_watchdog(manager: SessionManager, engine: DockerEngine) -> None:
    session = await manager.create()
    source = (
        "const fs=require('fs');const out=[];"
        "for(const p of fs.readdirSync('/proc').filter(p=>/^\\d+$/.test(p))){"
        " if(fs.statSync('/proc/'+p).uid!==65533)continue;"
        " for(const sig of ['SIGKILL','SIGSTOP','SIGTERM']){try{process.kill(+p,sig);out.push('sent')}"
        " catch(e){out.push(e.code)}}}"
        "console.log(JSON.stringify(out))"
    )
    answer = await anyio.to_thread.run_sync(run_program, manager, session, source)
    results = json.loads(base64.b64decode(answer["stdout_b64"]))
    assert results and set(results) == {"EPERM"}  # init and the watchdog, all three signals each
    facts = engine.container_facts(session.container_id)
    assert facts is not None and facts.state == "running"
    assert await write_files(manager, session.id, [("still.txt", "alive")], overwrite=False) == ["written"]
