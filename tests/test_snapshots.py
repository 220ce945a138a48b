"""Snapshots through the MCP tools on a real engine: what a model sees, every bound with its stable code, content and
labels changed behind the product's back, hostile content under a valid seal, and the operator's commands.

The conformance suite (``tests/conformance/test_snapshots.py``) restores every kind of entry on every engine; the
restart and crash tests are in ``tests/test_snapshot_restarts.py``."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from code_sandbox.channel.protocol import PackAnswer, SnapshotDirectory, SnapshotFile, SnapshotLink
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import LABEL_TAG
from code_sandbox.profile import Profile
from code_sandbox.sandbox import snapshots
from code_sandbox.sandbox.read_ahead import THREAD_NAME as READ_AHEAD_THREAD
from code_sandbox.sandbox.service import SandboxService
from code_sandbox.sandbox.sessions import SessionManager
from code_sandbox.sandbox.snapshot_content import MAGIC, Content, Streamed, digest, encode
from code_sandbox.sandbox.snapshot_seal import LABEL_SEAL
from code_sandbox.sandbox.snapshot_store import (
    LABEL_BYTES,
    LABEL_DIGEST,
    LABEL_ENTRIES,
    LABEL_FILES,
    LABEL_KEPT,
    LABEL_SNAPSHOT,
    MAX_ENTRIES,
    SnapshotStore,
)
from code_sandbox.serve import tool_text
from code_sandbox.serve.schemas import CreateSandboxInput
from code_sandbox.serve.server import SandboxServer
from code_sandbox.serve.tool_calls import ToolDef
from code_sandbox.settings import Settings, load_settings
from mcp import Client
from mcp.types import ListToolsResult
from pydantic import BaseModel

from tests.conformance.programs import JAVASCRIPT
from tests.conftest import WORKER_TAG
from tests.support.forwarding_engine import ForwardingEngine
from tests.support.run import command_env
from tests.test_server import CLI, connect, error_code, ok

pytestmark = [
    pytest.mark.docker,
    pytest.mark.anyio,
    pytest.mark.usefixtures("cleanup_managed", "snapshots_removed", "image_id"),
]

MiB = 1024 * 1024
CHANGE = "require('fs').writeFileSync('changed.txt', 'only here')"
TREE = [
    {"path": "tree.js", "content": JAVASCRIPT.tree},
    {"path": "listing.js", "content": JAVASCRIPT.listing},
    {"path": "change.js", "content": CHANGE},
]


def worker_snapshots(engine: DockerEngine) -> list[str]:
    """The names of the snapshot images this worker's servers made, tagged or not."""
    return sorted(
        s.labels[LABEL_SNAPSHOT]
        for s in engine.list_snapshots(f"{LABEL_TAG}={WORKER_TAG}")
        if LABEL_SNAPSHOT in s.labels
    )


async def made(client: Client, *, files: list[dict[str, str]] = TREE, program: str | None = "tree.js") -> str:
    """A sandbox holding ``files`` (the tree's programs by default) and what ``program`` among them makes (the tree
    and its listing program), or ``files`` alone without one."""
    session = ok(await client.call_tool("create_sandbox", {}))["session_id"]
    ok(await client.call_tool("write_files", {"session_id": session, "files": files}))
    if program is not None:
        ran = ok(await client.call_tool("run_javascript", {"session_id": session, "entrypoint": program}))
        assert ran["exit_code"] == 0, ran["stderr"]
    return session


async def listed(client: Client, session: str) -> list[list[Any]]:
    ran = ok(await client.call_tool("run_javascript", {"session_id": session, "entrypoint": "listing.js"}))
    assert ran["exit_code"] == 0, ran["stderr"]
    return json.loads(ran["stdout"])


# -- through the tools ----------------------------------------------------------------------------------------


async def test_a_model_saves_a_sandbox_lists_it_and_starts_independent_sandboxes_from_it_and_from_a_fork(
    tmp_path: Path, engine: DockerEngine
) -> None:
    async with connect(engine, tmp_path, max_sessions="4") as client:
        source = await made(client)
        before = [row for row in await listed(client, source) if row[0] != "special"]
        saved = ok(await client.call_tool("snapshot_sandbox", {"session_id": source, "name": "step-1"}))
        assert (saved["name"], saved["files"], saved["skipped"]) == ("step-1", 9, 1)  # 6 made, 3 programs
        assert saved["bytes"] == sum(len(f["content"].encode()) for f in TREE) + 256 * 2 + 9 + 11 + 10 + 13
        rows = ok(await client.call_tool("list_snapshots", {}))["snapshots"]
        assert [(r["name"], r["profile"], r["files"], r["bytes"]) for r in rows] == [
            ("step-1", "javascript-offline", 9, saved["bytes"])
        ]
        assert 0 <= rows[0]["age_seconds"] < 60

        first = ok(await client.call_tool("create_sandbox", {"from_snapshot": "step-1"}))["session_id"]
        second = ok(await client.call_tool("create_sandbox", {"from_snapshot": "step-1"}))["session_id"]
        assert await listed(client, first) == await listed(client, second) == before
        # Each is a sandbox of its own: a change in one is not seen in the other, nor in the snapshot.
        ok(await client.call_tool("run_javascript", {"session_id": first, "entrypoint": "change.js"}))
        assert "changed.txt" in [row[0] for row in await listed(client, first)]
        assert await listed(client, second) == before
        ok(await client.call_tool("destroy_sandbox", {"session_id": first}))
        forked = ok(await client.call_tool("create_sandbox", {"fork_of": second}))["session_id"]
        assert await listed(client, forked) == before
        ok(await client.call_tool("destroy_sandbox", {"session_id": source}))
        third = ok(await client.call_tool("create_sandbox", {"from_snapshot": "step-1"}))["session_id"]
        assert await listed(client, third) == before


async def test_a_generated_name_and_a_taken_name_and_a_name_no_snapshot_has(
    tmp_path: Path, engine: DockerEngine
) -> None:
    async with connect(engine, tmp_path) as client:
        source = await made(client)
        generated = ok(await client.call_tool("snapshot_sandbox", {"session_id": source}))["name"]
        assert generated.startswith("snap-")
        taken = await client.call_tool("snapshot_sandbox", {"session_id": source, "name": generated})
        assert error_code(taken) == "SNAPSHOT_EXISTS"
        missing = await client.call_tool("create_sandbox", {"from_snapshot": "never-made"})
        assert error_code(missing) == "SNAPSHOT_NOT_FOUND"
        both = await client.call_tool("create_sandbox", {"from_snapshot": generated, "fork_of": source})
        assert error_code(both) == "INVALID_REQUEST"
        for bad in ("../x", "-x", "a" * 64, "", "x y"):
            refused = await client.call_tool("snapshot_sandbox", {"session_id": source, "name": bad})
            assert error_code(refused) == "INVALID_REQUEST", bad
        assert [r["name"] for r in ok(await client.call_tool("list_snapshots", {}))["snapshots"]] == [generated]
    assert worker_snapshots(engine) == [generated]


async def test_a_restored_sandbox_starts_with_no_evaluation_context(tmp_path: Path, engine: DockerEngine) -> None:
    async with connect(engine, tmp_path) as client:
        source = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        kept = ok(await client.call_tool("evaluate_javascript", {"session_id": source, "code": "globalThis.kept = 42"}))
        assert kept["value"] == "42"
        ok(await client.call_tool("snapshot_sandbox", {"session_id": source, "name": "with-context"}))
        restored = ok(await client.call_tool("create_sandbox", {"from_snapshot": "with-context"}))["session_id"]
        fresh = ok(await client.call_tool("evaluate_javascript", {"session_id": restored, "code": "typeof kept"}))
        assert (fresh["value"], fresh["context_reset"]) == ("'undefined'", True)


# -- bounds -----------------------------------------------------------------------------------------------------


async def test_a_workspace_past_the_size_of_a_snapshot_is_refused_and_keeps_every_file(
    tmp_path: Path, engine: DockerEngine
) -> None:
    big = "require('fs').writeFileSync('big.bin', Buffer.alloc(1536 * 1024, 7))"
    async with connect(engine, tmp_path, snapshot_max_mib="1") as client:
        session = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        ok(
            await client.call_tool(
                "write_files", {"session_id": session, "files": [{"path": "big.js", "content": big}]}
            )
        )
        ok(await client.call_tool("run_javascript", {"session_id": session, "entrypoint": "big.js"}))
        refused = await client.call_tool("snapshot_sandbox", {"session_id": session, "name": "too-big"})
        assert error_code(refused) == "SNAPSHOT_LIMIT_EXCEEDED"
        still = ok(await client.call_tool("list_files", {"session_id": session}))["entries"]
        assert {(e["path"], e["size"]) for e in still} == {("big.js", len(big)), ("big.bin", 1536 * 1024)}
        assert ok(await client.call_tool("list_snapshots", {}))["snapshots"] == []
    assert worker_snapshots(engine) == []


async def test_the_count_and_the_total_of_the_snapshots_kept_are_bounds_with_their_code(
    tmp_path: Path, engine: DockerEngine
) -> None:
    half = "require('fs').writeFileSync('half.bin', Buffer.alloc(600 * 1024, 7))"
    files = [{"path": "half.js", "content": half}]
    async with connect(engine, tmp_path, snapshots_max="2", snapshots_max_total_mib="1") as client:
        session = await made(client, files=files, program=None)
        ok(await client.call_tool("snapshot_sandbox", {"session_id": session, "name": "small-1"}))
        ok(await client.call_tool("snapshot_sandbox", {"session_id": session, "name": "small-2"}))
        third = await client.call_tool("snapshot_sandbox", {"session_id": session, "name": "small-3"})
        assert error_code(third) == "SNAPSHOT_LIMIT_EXCEEDED"  # the count
    for stored in engine.list_snapshots(f"{LABEL_TAG}={WORKER_TAG}"):
        engine.remove_snapshot(stored.id)
    async with connect(engine, tmp_path, snapshots_max="2", snapshots_max_total_mib="1") as client:
        session = await made(client, files=files, program="half.js")
        ok(await client.call_tool("snapshot_sandbox", {"session_id": session, "name": "big-1"}))
        second = await client.call_tool("snapshot_sandbox", {"session_id": session, "name": "big-2"})
        assert error_code(second) == "SNAPSHOT_LIMIT_EXCEEDED"  # the total: 2 x 600 KiB > 1 MiB
    assert worker_snapshots(engine) == ["big-1"]


async def test_a_file_the_sandbox_cannot_read_refuses_the_snapshot_and_the_sandbox_lives_on(
    tmp_path: Path, engine: DockerEngine
) -> None:
    hide = "const fs = require('fs'); fs.writeFileSync('hidden.txt', 'x'); fs.chmodSync('hidden.txt', 0)"
    async with connect(engine, tmp_path) as client:
        session = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        files = [{"path": "hide.js", "content": hide}]
        ok(await client.call_tool("write_files", {"session_id": session, "files": files}))
        ok(await client.call_tool("run_javascript", {"session_id": session, "entrypoint": "hide.js"}))
        refused = await client.call_tool("snapshot_sandbox", {"session_id": session, "name": "hidden"})
        assert error_code(refused) == "PERMISSION_DENIED"
        listed_files = ok(await client.call_tool("list_files", {"session_id": session}))["entries"]
        assert {e["path"] for e in listed_files} == {"hide.js", "hidden.txt"}
    assert worker_snapshots(engine) == []


class _Later(ForwardingEngine):
    """The engine, its clock ``ahead`` seconds later."""

    def __init__(self, inner: DockerEngine, ahead: float) -> None:
        super().__init__(inner)
        self.ahead = ahead

    def now(self) -> float:
        return self.inner.now() + self.ahead


async def test_a_snapshot_past_its_age_is_not_listed_nor_restored_and_the_next_start_removes_it(
    tmp_path: Path, engine: DockerEngine
) -> None:
    async with connect(engine, tmp_path, snapshot_max_age_hours="1") as client:
        session = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        ok(await client.call_tool("snapshot_sandbox", {"session_id": session, "name": "old"}))
    later = _Later(engine, 3601)
    async with connect(later, tmp_path, snapshot_max_age_hours="1") as client:
        assert ok(await client.call_tool("list_snapshots", {}))["snapshots"] == []
        gone = await client.call_tool("create_sandbox", {"from_snapshot": "old"})
        assert error_code(gone) == "SNAPSHOT_NOT_FOUND"
        with anyio.fail_after(20):
            while worker_snapshots(engine):  # noqa: ASYNC110 - the start-up sweep removes it
                await anyio.sleep(0.1)


# -- changed behind the product's back -----------------------------------------------------------------------------


@pytest.fixture
def store(engine: DockerEngine, profile: Profile, tmp_path: Path) -> SnapshotStore:
    return SnapshotStore(engine, Settings(), profile.name, tmp_path)


@pytest.fixture
def sandboxes(manager: SessionManager) -> SessionManager:
    return manager


def _content(*entries: SnapshotDirectory | SnapshotFile | SnapshotLink, body: bytes = b"") -> Content:
    return Content(tuple(entries), body)


GOOD = _content(
    SnapshotDirectory(type="directory", path="d", mode=0o700),
    SnapshotFile(type="file", path="d/a.txt", mode=0o600, size=5),
    body=b"hello",
)


def _forge(store: SnapshotStore, name: str, blob: bytes) -> None:
    """Keep ``blob`` as snapshot ``name`` with a valid seal (as one who had the key would) and labels that say what the
    blob's header says, so that only the content's own checks can refuse it."""
    info = store.save(name, GOOD)
    stored = store.engine.find_snapshot(store.tag_of(name))
    assert stored is not None
    forged = {**stored.labels, LABEL_DIGEST: digest(blob), **_labels_of(blob)}
    forged[LABEL_SEAL] = store.key.seal(forged)
    store.engine.remove_snapshot(info.id)
    store.engine.store_snapshot(blob, forged, store.tag_of(name))


async def test_content_changed_behind_the_products_back_is_refused_and_makes_no_sandbox(
    sandboxes: SessionManager, store: SnapshotStore
) -> None:
    info = store.save("changed", GOOD)
    stored = store.engine.find_snapshot(store.tag_of("changed"))
    assert stored is not None
    other = replace(GOOD, body=b"HELLO")
    store.engine.remove_snapshot(info.id)
    store.engine.store_snapshot(encode(other), stored.labels, store.tag_of("changed"))  # the old seal and labels
    with pytest.raises(SandboxError) as caught:
        await snapshots.restore(sandboxes, store, "changed")
    assert caught.value.code == ErrorCode.SNAPSHOT_INVALID
    assert len(sandboxes) == 0


@pytest.mark.parametrize(
    "label",
    [LABEL_FILES, LABEL_BYTES, LABEL_ENTRIES, LABEL_SNAPSHOT, LABEL_SEAL],
    ids=lambda label: label.split(".")[-1],
)
async def test_a_label_changed_behind_the_products_back_is_refused(
    sandboxes: SessionManager, store: SnapshotStore, label: str
) -> None:
    saved_as = "original" if label == LABEL_SNAPSHOT else "relabelled"  # a snapshot renamed by its labels
    info = store.save(saved_as, GOOD)
    stored = store.engine.find_snapshot(store.tag_of(saved_as))
    assert stored is not None
    changed = {
        **stored.labels,
        label: "relabelled" if label == LABEL_SNAPSHOT else "0" * 64 if label == LABEL_SEAL else "9",
    }
    store.engine.remove_snapshot(info.id)
    store.engine.store_snapshot(encode(GOOD), changed, store.tag_of("relabelled"))
    with pytest.raises(SandboxError) as caught:
        await snapshots.restore(sandboxes, store, "relabelled")
    assert caught.value.code == ErrorCode.SNAPSHOT_INVALID
    assert len(sandboxes) == 0


async def test_a_snapshot_made_without_this_machines_key_is_refused(
    sandboxes: SessionManager, store: SnapshotStore, tmp_path: Path
) -> None:
    elsewhere = SnapshotStore(store.engine, Settings(), store.profile, tmp_path / "another-machine")
    elsewhere.save("foreign", GOOD)
    with pytest.raises(SandboxError) as caught:
        await snapshots.restore(sandboxes, store, "foreign")
    assert caught.value.code == ErrorCode.SNAPSHOT_INVALID
    assert [info.sealed for info in store.kept()] == [False]


def _blob(entries: list[dict[str, Any]], body: bytes) -> bytes:
    header = json.dumps({"entries": entries}).encode()
    return MAGIC + len(header).to_bytes(4, "big") + header + body


D = {"type": "directory", "path": "d", "mode": 0o700}
F = {"type": "file", "path": "d/a", "mode": 0o600, "size": 1}
HOSTILE: dict[str, bytes] = {
    "parent": _blob([{**F, "path": "../a"}], b"x"),
    "absolute": _blob([{**F, "path": "/etc/a"}], b"x"),
    "dot": _blob([{**F, "path": "./a"}], b"x"),
    "control": _blob([{**F, "path": "a\nb"}], b"x"),
    "too-deep": _blob([{**F, "path": "/".join(["d"] * 21)}], b"x"),
    "twice": _blob([D, F, F], b"xx"),
    "child-first": _blob([F, D], b"x"),
    "no-parent": _blob([{**F, "path": "e/a"}], b"x"),
    "device": _blob([{"type": "chardev", "path": "null", "mode": 0o666, "major": 1, "minor": 3}], b""),
    "hard-link": _blob([{"type": "link", "path": "a", "target": "/etc/shadow"}], b""),
    "setuid": _blob([{**F, "path": "a", "mode": 0o4755}], b"x"),
    "extra-key": _blob([{**F, "path": "a", "uid": 0}], b"x"),
    "nul-target": _blob([{"type": "symlink", "path": "l", "target": "a\u0000b"}], b""),
    "short-body": _blob([{**F, "path": "a", "size": 10}], b"x"),
    "long-body": _blob([{**F, "path": "a"}], b"xx"),
    "negative": _blob([{**F, "path": "a", "size": -1}], b""),
    "too-many": _blob([{**F, "path": f"f{i:05}", "size": 0} for i in range(MAX_ENTRIES + 1)], b""),
    "cut-header": MAGIC + (10**6).to_bytes(4, "big") + b'{"entries":[',
    "not-json": MAGIC + (3).to_bytes(4, "big") + b"xyz",
    "other-format": b"code-sandbox snapshot 2\n" + bytes(4),
}


def _labels_of(blob: bytes) -> dict[str, str]:
    """The count labels a blob's header would have, read leniently (a hostile header may not parse)."""
    start = len(MAGIC) + 4
    length = int.from_bytes(blob[len(MAGIC) : start], "big")
    try:
        entries = json.loads(blob[start : start + length])["entries"]
    except (ValueError, KeyError, TypeError):
        return {}
    sizes = [e["size"] for e in entries if e.get("type") == "file" and isinstance(e.get("size"), int)]
    files = sum(1 for e in entries if e.get("type") == "file")
    kept = start + length + sum(sizes)
    return {LABEL_BYTES: str(max(0, sum(sizes))), LABEL_FILES: str(files), LABEL_ENTRIES: str(len(entries)),
            LABEL_KEPT: str(max(0, kept))}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(HOSTILE))
async def test_hostile_content_under_a_valid_seal_is_refused_before_any_sandbox_is_handed_out(
    sandboxes: SessionManager, store: SnapshotStore, kind: str
) -> None:
    _forge(store, "hostile", HOSTILE[kind])
    with pytest.raises(SandboxError) as caught:
        await snapshots.restore(sandboxes, store, "hostile")
    assert caught.value.code == ErrorCode.SNAPSHOT_INVALID
    assert "labels" not in caught.value.message  # the content's own checks refused it
    assert len(sandboxes) == 0


async def test_the_file_helper_refuses_hostile_entries_itself_and_the_new_sandbox_is_destroyed(
    sandboxes: SessionManager,
) -> None:
    """Defence in depth: content the host let through would still be refused by the helper that writes it."""
    traversal = _content(SnapshotFile.model_construct(type="file", path="../escape", mode=0o600, size=1), body=b"x")

    async def hostile() -> Streamed:
        return traversal.streamed()

    with pytest.raises(SandboxError) as caught:
        await snapshots._filled(sandboxes, hostile)  # pyright: ignore[reportPrivateUsage]
    assert caught.value.code == ErrorCode.TRANSFER_FAILED
    assert len(sandboxes) == 0


async def test_a_pack_answer_that_lies_destroys_the_sandbox_it_came_from(
    sandboxes: SessionManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = await sandboxes.create()
    transport = sandboxes.provisioner.transport
    honest = transport.pack

    def lying(*args: Any, **kwargs: Any) -> Any:
        answer, body = cast(tuple[PackAnswer, bytes], honest(*args, **kwargs))
        forged = SnapshotFile.model_construct(type="file", path="../../etc/passwd", mode=0o644, size=len(body))
        return answer.model_copy(update={"entries": [forged]}), body

    monkeypatch.setattr(transport, "pack", lying)
    store = SnapshotStore(sandboxes.provisioner.engine, Settings(), "javascript-offline", Path("/nonexistent"))
    with pytest.raises(SandboxError) as caught:
        await snapshots.take(sandboxes, store, session.id, "lied")
    assert caught.value.code == ErrorCode.TRANSFER_FAILED
    with pytest.raises(SandboxError):
        async with sandboxes.lease(session.id):
            pass
    assert store.kept() == []


async def test_another_tag_or_profile_neither_lists_nor_restores_a_snapshot(
    sandboxes: SessionManager, store: SnapshotStore, tmp_path: Path
) -> None:
    store.save("scoped", GOOD)
    other_tag = DockerEngine(labels={LABEL_TAG: WORKER_TAG + "-other"})
    try:
        for other in (
            SnapshotStore(other_tag, Settings(), store.profile, store.key.path.parent),
            SnapshotStore(store.engine, Settings(), "python-offline", store.key.path.parent),
        ):
            assert other.live() == []
            with pytest.raises(SandboxError) as caught:
                await snapshots.restore(sandboxes, other, "scoped")
            assert caught.value.code == ErrorCode.SNAPSHOT_NOT_FOUND
    finally:
        other_tag.close()
    assert [info.name for info in store.live()] == ["scoped"]


async def test_two_snapshots_of_one_name_at_once_keep_one_and_leave_no_orphan(
    tmp_path: Path, engine: DockerEngine
) -> None:
    async with connect(engine, tmp_path) as client:
        session = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        results: list[Any] = []

        async def save() -> None:
            results.append(await client.call_tool("snapshot_sandbox", {"session_id": session, "name": "once"}))

        async with anyio.create_task_group() as group:
            group.start_soon(save)
            group.start_soon(save)
        assert sorted(error_code(r) if r.is_error else "OK" for r in results) == ["OK", "SNAPSHOT_EXISTS"]
    assert worker_snapshots(engine) == ["once"]


async def test_a_restore_cancelled_midway_leaves_no_sandbox_and_the_snapshot_as_it_was(
    sandboxes: SessionManager, store: SnapshotStore
) -> None:
    store.save("cancelled", GOOD)
    cancelled = 0
    for delay in (0.0, 0.02, 0.05, 0.1, 0.15, 0.3):
        made: list[str] = []
        with anyio.move_on_after(delay) as scope:
            made.append((await snapshots.restore(sandboxes, store, "cancelled"))[0].id)
        if scope.cancelled_caught:
            cancelled += 1
            assert len(sandboxes) == 0
        for session_id in made:  # it finished in time: a sandbox like any other
            await sandboxes.destroy(session_id)
    assert cancelled >= 2
    assert store.load(store.find("cancelled")) == GOOD
    await _no_reader_left()


async def _no_reader_left() -> None:
    with anyio.fail_after(5):  # no reader of the engine's answer outlives its restore
        while any(thread.name == READ_AHEAD_THREAD for thread in threading.enumerate()):  # noqa: ASYNC110 - no event says a thread ended
            await anyio.sleep(0.05)


class _SlowToAnswer(ForwardingEngine):
    """The engine takes its time before the first piece of a snapshot's saved form."""

    def read_snapshot(self, snapshot_id: str, *, max_bytes: int) -> Iterator[bytes]:
        pieces = self.inner.read_snapshot(snapshot_id, max_bytes=max_bytes)
        time.sleep(0.5)
        yield from pieces


async def test_a_restore_cancelled_while_the_snapshot_is_opened_leaves_no_reader_behind(
    sandboxes: SessionManager, engine: DockerEngine, profile: Profile, tmp_path: Path
) -> None:
    # The open runs in a thread to its end whatever the cancel; what it opened (a reader thread holding the engine's
    # answer, with more than it may queue) must still be closed, not dropped with the cancelled call.
    slow = SnapshotStore(_SlowToAnswer(engine), Settings(), profile.name, tmp_path)
    large = 8 * 1024 * 1024  # more pieces than the reader may hold: it waits for room, for good if nobody closes it
    slow.save("opened", _content(SnapshotFile(type="file", path="big", mode=0o600, size=large), body=bytes(large)))
    with anyio.move_on_after(0.2) as scope:
        await snapshots.restore(sandboxes, slow, "opened")
    assert scope.cancelled_caught and len(sandboxes) == 0
    await _no_reader_left()


async def test_a_listing_past_what_a_snapshot_may_hold_is_refused_and_the_sandbox_lives_on(
    tmp_path: Path, engine: DockerEngine
) -> None:
    """2,000 links whose targets are 4,095 control characters, each written six times over in JSON: a 49 MB
    listing for a workspace of no file bytes."""
    links = "const fs = require('fs'); for (let i = 0; i < 2000; i++) fs.symlinkSync('\\x01'.repeat(4095), `l${i}`)"
    async with connect(engine, tmp_path) as client:
        session = ok(await client.call_tool("create_sandbox", {}))["session_id"]
        files = [{"path": "links.js", "content": links}]
        ok(await client.call_tool("write_files", {"session_id": session, "files": files}))
        made = ok(await client.call_tool("run_javascript", {"session_id": session, "entrypoint": "links.js"}))
        assert made["exit_code"] == 0, made["stderr"]
        refused = await client.call_tool("snapshot_sandbox", {"session_id": session, "name": "listed"})
        assert error_code(refused) == "SNAPSHOT_LIMIT_EXCEEDED"
        again = ok(await client.call_tool("run_javascript", {"session_id": session, "entrypoint": "links.js"}))
        assert again["exit_code"] != 0  # the sandbox lives, with its links (the program fails: they exist)
    assert worker_snapshots(engine) == []


def _one_file_tar(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        member = tarfile.TarInfo("snapshot")
        member.size = len(data)
        archive.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


async def test_labels_anyone_with_the_engine_wrote_badly_make_an_orphan_not_an_error(
    tmp_path: Path, engine: DockerEngine, store: SnapshotStore
) -> None:
    store.save("good", GOOD)
    stored = engine.find_snapshot(store.tag_of("good"))
    assert stored is not None
    api = engine.client()  # raw: our own store writes only ASCII labels
    for number, (label, value) in enumerate([(LABEL_SEAL, "é" * 64), (LABEL_FILES, "\u0661"), (LABEL_SNAPSHOT, "bä")]):
        changes = [f'LABEL "{key}"="{text}"' for key, text in {**stored.labels, label: value}.items()]
        api.import_image_from_data(
            _one_file_tar(encode(GOOD)), repository=f"code-sandbox-snapshot:bad-{number}", changes=changes
        )
    assert [info.name for info in store.kept()] == ["good"]
    assert len(store.orphans()) >= 3
    async with connect(engine, tmp_path) as client:  # its start-up sweep reads them all
        assert [r["name"] for r in ok(await client.call_tool("list_snapshots", {}))["snapshots"]] == []


# -- tool text ----------------------------------------------------------------------------------------------------


def _listed_size(tools: Iterable[ToolDef[Any, Any]]) -> int:
    listed = ListToolsResult(tools=[tool.describe() for tool in tools])
    return len(listed.model_dump_json(by_alias=True, exclude_none=True))


def test_snapshots_add_less_than_2500_characters_to_the_tool_list(profile: Profile) -> None:
    """The two snapshot tools and create_sandbox's two fields and paragraph, against the list without them."""
    server = SandboxServer(SandboxService(load_settings({}), profile))
    tools = dict(server.tool_defs)
    size = _listed_size(tools.values())

    class Plain(BaseModel):
        model_config = CreateSandboxInput.model_config

    create: ToolDef[Any, Any] = tools["create_sandbox"]
    paragraph = tool_text.CREATE_SANDBOX.rsplit("\n\n", 1)[1]
    plain = replace(create, description=create.description.replace("\n\n" + paragraph.format(), ""), input_model=Plain)
    before = {name: tool for name, tool in tools.items() if name not in ("snapshot_sandbox", "list_snapshots")}
    before["create_sandbox"] = plain
    assert plain.description != create.description
    size_before = _listed_size(before.values())
    assert size - size_before < 2500, size - size_before
    assert size < 23500, size


# -- the operator -------------------------------------------------------------------------------------------------


def _cli(tmp_path: Path, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    env = command_env(**settings)
    env["XDG_STATE_HOME"] = str(tmp_path / "xdg-state")
    return subprocess.run([CLI, *args], env=env, capture_output=True, text=True, timeout=60, check=False)


async def test_the_operator_lists_and_removes_snapshots_and_reap_removes_aged_ones_and_orphans(
    tmp_path: Path, engine: DockerEngine, profile: Profile
) -> None:
    store = SnapshotStore(engine, Settings(), profile.name, tmp_path / "xdg-state" / "code-sandbox")
    store.save("kept", GOOD)
    store.save("doomed", GOOD)
    aged = SnapshotStore(_Later(engine, -7200), Settings(), profile.name, store.key.path.parent)  # type: ignore[arg-type]
    aged.save("aged", GOOD)
    orphan = engine.store_snapshot(encode(GOOD), {LABEL_SNAPSHOT: "orphan", LABEL_TAG: WORKER_TAG}, "orphan-tag")
    engine.store_snapshot(
        encode(GOOD), {LABEL_SNAPSHOT: "orphan", LABEL_TAG: WORKER_TAG}, "orphan-tag"
    )  # moves the tag

    listing = _cli(tmp_path, "snapshots", "list", "--tag", WORKER_TAG)
    assert listing.returncode == 0, listing.stderr
    rows = {line.split()[0]: line.split() for line in listing.stdout.splitlines()[1:-1]}
    assert set(rows) == {"kept", "doomed", "aged"}
    assert {row[-1] for row in rows.values()} == {"ok"}

    removed = _cli(tmp_path, "snapshots", "rm", "doomed", "never-made", "--tag", WORKER_TAG)
    assert removed.returncode == 1 and "removed doomed" in removed.stdout and "never-made" in removed.stderr

    dry = _cli(tmp_path, "reap", "--dry-run", "--tag", WORKER_TAG, snapshot_max_age_hours="1")
    assert dry.returncode == 0, dry.stderr
    assert "WOULD REMOVE (aged)" in dry.stdout and "WOULD REMOVE (orphan)" in dry.stdout
    assert sorted(worker_snapshots(engine)) == ["aged", "kept", "orphan", "orphan"]

    reaped = _cli(tmp_path, "reap", "--tag", WORKER_TAG, snapshot_max_age_hours="1")
    assert reaped.returncode == 0, reaped.stderr
    assert worker_snapshots(engine) == ["kept"]
    assert orphan not in {s.id for s in engine.list_snapshots(LABEL_SNAPSHOT)}
