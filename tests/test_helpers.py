"""The three in-container helpers, exercised in the real image with the real hardening."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import anyio.to_thread
import pytest
from code_sandbox.channel.protocol import ListAnswer, ListRequest, Refusal, RunRequest
from code_sandbox.channel.transport import HelperExecs, Target
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import PROBE_UID, ContainerRequest, Hardening, user_of
from code_sandbox.profile import Profile
from code_sandbox.sandbox.sessions import Session, SessionManager
from code_sandbox.sandbox.workspace import read_file

from tests.conftest import TEST_LABEL, WORKER_TAG
from tests.support.images import untag_image

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]
MiB = 1024 * 1024


def run_program(manager: SessionManager, session: Session, source: str, *, timeout_ms: int = 10_000) -> dict[str, Any]:
    """Run JavaScript through the runner helper, as the run tool does."""
    request = RunRequest(
        argv=["/usr/local/bin/node", "-e", source], timeout_ms=timeout_ms, stdout_cap=MiB, stderr_cap=MiB, stream=False
    )
    target = Target(session.container_id, session.user)
    answer = manager.provisioner.transport.run(target, request, timeout=timeout_ms / 1000 + 10)
    return answer.model_dump()


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
    engine: DockerEngine, profile: Profile, image_id: str
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
    tag = f"code-sandbox-test-fifo:{WORKER_TAG}"  # this worker's own: concurrent runs never share it
    derived = engine.build_image(buffer, tag=tag, labels={}, on_step=lambda _step: None)
    request = ContainerRequest(
        image_id=derived,
        command=[*profile.helper_argv("watchdog"), "60"],
        labels={TEST_LABEL: "1"},
        apparmor=engine.daemon_facts().apparmor,
        hardening=_NoWorkspaceTmpfs(),
    )
    container_id = engine.create_container(request)
    try:
        target = Target(container_id, user_of(PROBE_UID))
        listing = ListRequest(path=".", recursive=False, max_depth=0, max_entries=10)
        answer = HelperExecs(engine, profile).call(target, "files", ["list"], ListAnswer, request=listing, timeout=30)
    finally:
        engine.remove_container(container_id)
        untag_image(engine, tag)
    assert isinstance(answer, Refusal) and answer.code == "WORKSPACE_INTEGRITY"
