"""Snapshots on every kind of engine (runc, gVisor, TLS, Podman) with every profile in the repository: a sandbox's
workspace kept on the engine and restored, or forked, with every file, directory, mode and link as it was."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import LABEL_TAG
from code_sandbox.profile import Profile
from code_sandbox.sandbox import snapshots
from code_sandbox.sandbox.execution import run_entrypoint
from code_sandbox.sandbox.sessions import SessionManager
from code_sandbox.sandbox.snapshot_store import LABEL_SNAPSHOT, SnapshotStore
from code_sandbox.sandbox.workspace import write_files
from code_sandbox.settings import Settings

from tests.conformance.programs import Programs
from tests.support.run import worker_tag

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]


@pytest.fixture
def store(engine: DockerEngine, conformance_profile: Profile, tmp_path: Path) -> Iterator[SnapshotStore]:
    """The snapshots of this worker's tag and the profile under test; every one of the tag is removed afterwards."""
    store = SnapshotStore(engine, Settings(), conformance_profile.name, tmp_path)
    yield store
    for stored in engine.list_snapshots(f"{LABEL_TAG}={worker_tag()}"):
        if LABEL_SNAPSHOT in stored.labels:
            engine.remove_snapshot(stored.id)


async def listing(sandboxes: SessionManager, session_id: str, programs: Programs) -> list[list[object]]:
    result = await run_entrypoint(sandboxes, session_id, f"listing{programs.suffix}", [], timeout_seconds=20)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


async def made_tree(sandboxes: SessionManager, programs: Programs) -> tuple[str, list[list[object]]]:
    """A sandbox whose workspace holds :attr:`Programs.tree`'s entries, and its listing. Both programs are written
    first: the tree holds links, which the file tools refuse to work beside."""
    session = await sandboxes.create()
    sources = [(f"tree{programs.suffix}", programs.tree), (f"listing{programs.suffix}", programs.listing)]
    await write_files(sandboxes, session.id, sources, overwrite=False)
    made = await run_entrypoint(sandboxes, session.id, f"tree{programs.suffix}", [], timeout_seconds=20)
    assert made.exit_code == 0, made.stderr
    return session.id, await listing(sandboxes, session.id, programs)


async def test_a_snapshot_brings_back_every_file_directory_mode_and_link_and_leaves_out_special_files(
    sandboxes: SessionManager, programs: Programs, store: SnapshotStore
) -> None:
    source, before = await made_tree(sandboxes, programs)
    kinds = {row[0]: row[1] for row in before}
    assert kinds["special"] == "other" and kinds["keep/link"] == kinds["dangling"] == "symlink"
    info, content = await snapshots.take(sandboxes, store, source, "conformance")
    assert (info.name, content.skipped) == ("conformance", 1)
    assert info.files == 8  # 5 files, the hard link kept as a file of its own, and the two programs
    await sandboxes.destroy(source)

    restored, _content = await snapshots.restore(sandboxes, store, "conformance")
    after = await listing(sandboxes, restored.id, programs)
    assert after == [row for row in before if row[0] != "special"]
    modes = {row[0]: row[2] for row in after}
    assert (modes["locked"], modes["keep/inner"], modes["ro.txt"], modes["run.sh"]) == (0o500, 0o750, 0o400, 0o755)


async def test_a_fork_is_a_copy_of_the_workspace_that_keeps_nothing_on_the_engine(
    sandboxes: SessionManager, programs: Programs, store: SnapshotStore
) -> None:
    source, before = await made_tree(sandboxes, programs)
    forked, _content = await snapshots.fork(sandboxes, source)
    assert await listing(sandboxes, forked.id, programs) == [row for row in before if row[0] != "special"]
    assert await listing(sandboxes, source, programs) == before  # the source is as it was
    assert store.kept() == []


async def test_a_snapshot_that_does_not_exist_is_not_found_and_makes_no_sandbox(
    sandboxes: SessionManager, store: SnapshotStore
) -> None:
    with pytest.raises(SandboxError) as caught:
        await snapshots.restore(sandboxes, store, "never-made")
    assert caught.value.code == ErrorCode.SNAPSHOT_NOT_FOUND
    assert len(sandboxes) == 0
