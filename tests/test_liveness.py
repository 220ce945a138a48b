"""Server liveness markers, and the sweep that removes the orphans of a stopped server but never a live peer's."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.engine import ContainerFacts, Engine
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import (
    LABEL_EXPIRES_AT,
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_SESSION,
    LABEL_TAG,
    ContainerRequest,
)
from code_sandbox.liveness import (
    ServerMarker,
    default_state_dir,
    owner_alive,
    prune_stopped_servers,
)
from code_sandbox.sandbox.sweep import judge_container, survey_managed, sweep_managed
from code_sandbox_cli.main import app
from typer.testing import CliRunner

from tests.conftest import TEST_LABEL, WORKER_TAG
from tests.support.forwarding_engine import ForwardingEngine
from tests.support.memory_engine import MemoryEngine

_HOLD_A_MARKER = """
import sys
from pathlib import Path
from code_sandbox.liveness import ServerMarker

marker = ServerMarker.acquire(Path(sys.argv[1]))
print(marker.owner if marker.recorded else "unrecorded", flush=True)
sys.stdin.read()  # holds the marker until killed
"""


def _killed_server(state_dir: Path) -> str:
    """The owner token of a server that recorded its marker and was then killed with SIGKILL."""
    with subprocess.Popen(
        [sys.executable, "-c", _HOLD_A_MARKER, str(state_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as proc:
        assert proc.stdout is not None
        owner = proc.stdout.readline().decode().strip()
        assert re.fullmatch(r"[0-9a-f]{16}", owner), owner
        assert owner_alive(state_dir, owner) is True  # held by another process
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return owner


def _marker_path(state_dir: Path, owner: str) -> Path:
    return state_dir / "servers" / f"{owner}.lock"


def _facts(owner: str | None, *, state: str = "running", expires_in: float = 600, age: float = 5) -> ContainerFacts:
    now = time.time()
    labels = {LABEL_MANAGED: "true", LABEL_EXPIRES_AT: str(int(now + expires_in))}
    if owner is not None:
        labels[LABEL_OWNER] = owner
    return ContainerFacts(id=f"id-{owner}-{state}", labels=labels, state=state, created=now - age)


# -- the state directory -------------------------------------------------------------------------------------------


def test_state_dir_is_under_an_absolute_xdg_state_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_state_dir() == tmp_path / "state" / "code-sandbox"


@pytest.mark.parametrize("xdg", [None, "", "relative/state"])
def test_state_dir_falls_back_to_local_state_in_home_without_an_absolute_xdg_state_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, xdg: str | None
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    if xdg is None:
        monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_STATE_HOME", xdg)
    assert default_state_dir() == tmp_path / ".local" / "state" / "code-sandbox"


# -- markers -------------------------------------------------------------------------------------------------------


def test_a_held_marker_reads_alive_and_is_private_to_its_user(tmp_path: Path) -> None:
    marker = ServerMarker.acquire(tmp_path)
    try:
        assert marker.recorded
        assert re.fullmatch(r"[0-9a-f]{16}", marker.owner)
        assert owner_alive(tmp_path, marker.owner) is True
        path = _marker_path(tmp_path, marker.owner)
        assert marker.path == path
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE((tmp_path / "servers").stat().st_mode) == 0o700
        assert prune_stopped_servers(tmp_path) == 0
        assert path.exists()
    finally:
        marker.release()


def test_a_released_marker_reads_unknown_and_leaves_no_file(tmp_path: Path) -> None:
    marker = ServerMarker.acquire(tmp_path)
    marker.release()
    marker.release()  # idempotent
    assert not marker.recorded
    assert owner_alive(tmp_path, marker.owner) is None
    assert list((tmp_path / "servers").iterdir()) == []


def test_a_marker_whose_server_was_killed_reads_dead_until_pruned(tmp_path: Path) -> None:
    owner = _killed_server(tmp_path)
    # Reading never deletes the evidence: a dry run, or a second container of the same server, sees it again.
    assert owner_alive(tmp_path, owner) is False
    assert owner_alive(tmp_path, owner) is False
    assert prune_stopped_servers(tmp_path) == 1
    assert not _marker_path(tmp_path, owner).exists()
    assert owner_alive(tmp_path, owner) is None


def test_a_marker_left_behind_on_release_reads_dead(tmp_path: Path) -> None:
    marker = ServerMarker.acquire(tmp_path)
    marker.release(leave_marker=True)
    assert owner_alive(tmp_path, marker.owner) is False


def test_pruning_keeps_a_stopped_servers_marker_while_it_still_has_containers(tmp_path: Path) -> None:
    owner = _killed_server(tmp_path)
    assert prune_stopped_servers(tmp_path, keep={owner}) == 0
    assert owner_alive(tmp_path, owner) is False


@pytest.mark.parametrize(
    "owner", ["../escaped", "0123456789ABCDEF", "0123456789abcde", "0123456789abcdef0", "0123456789abcde\n", ""]
)
def test_an_owner_that_is_not_sixteen_lowercase_hex_digits_is_unknown_without_touching_the_filesystem(
    tmp_path: Path, owner: str
) -> None:
    ServerMarker.acquire(tmp_path).release()  # makes servers/
    planted = tmp_path / "servers" / f"{owner}.lock"
    planted.write_bytes(b"")  # an unlocked file that would read "dead" if the token were used as a path
    assert owner_alive(tmp_path, owner) is None
    assert prune_stopped_servers(tmp_path) == 0
    assert planted.exists()


def test_a_symlink_planted_at_the_marker_path_is_unknown_and_never_followed(tmp_path: Path) -> None:
    ServerMarker.acquire(tmp_path).release()
    owner = "0123456789abcdef"
    target = tmp_path / "target"
    target.write_bytes(b"")  # unlocked: following the link would read "dead" and delete it
    _marker_path(tmp_path, owner).symlink_to(target)
    assert owner_alive(tmp_path, owner) is None
    assert prune_stopped_servers(tmp_path) == 0
    assert _marker_path(tmp_path, owner).is_symlink() and target.exists()


@pytest.mark.timeout(20)
def test_a_fifo_planted_at_the_marker_path_is_unknown_without_blocking(tmp_path: Path) -> None:
    ServerMarker.acquire(tmp_path).release()
    owner = "0123456789abcdef"
    os.mkfifo(_marker_path(tmp_path, owner), 0o600)
    assert owner_alive(tmp_path, owner) is None
    assert prune_stopped_servers(tmp_path) == 0
    assert stat.S_ISFIFO(_marker_path(tmp_path, owner).lstat().st_mode)


def test_a_servers_directory_that_others_can_write_is_not_trusted(tmp_path: Path) -> None:
    owner = _killed_server(tmp_path)
    (tmp_path / "servers").chmod(0o777)
    assert owner_alive(tmp_path, owner) is None
    assert not ServerMarker.acquire(tmp_path).recorded


def test_an_unusable_state_dir_gives_a_marker_with_a_token_but_no_file(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_bytes(b"")
    marker = ServerMarker.acquire(not_a_dir)
    assert not marker.recorded and marker.path is None
    assert re.fullmatch(r"[0-9a-f]{16}", marker.owner)
    assert owner_alive(not_a_dir, marker.owner) is None
    marker.release()


# -- judging containers --------------------------------------------------------------------------------------------


def test_a_running_unexpired_container_of_a_stopped_server_is_removed_as_an_orphan() -> None:
    verdict = judge_container(_facts("a" * 16), max_lifetime=600, now=time.time(), owner_alive=lambda _: False)
    assert (verdict.remove, verdict.reason, verdict.owner) == (True, "orphan of a stopped server", "dead")


def test_a_running_unexpired_container_of_a_live_server_is_kept() -> None:
    verdict = judge_container(_facts("a" * 16), max_lifetime=600, now=time.time(), owner_alive=lambda _: True)
    assert (verdict.remove, verdict.reason, verdict.owner) == (False, "live", "live")


def test_a_running_unexpired_container_of_an_unknown_server_is_kept() -> None:
    verdict = judge_container(_facts("a" * 16), max_lifetime=600, now=time.time(), owner_alive=lambda _: None)
    assert (verdict.remove, verdict.reason, verdict.owner) == (False, "live", "unknown")


def test_a_container_without_an_owner_label_is_of_an_unknown_server() -> None:
    verdict = judge_container(_facts(None), max_lifetime=600, now=time.time(), owner_alive=lambda _: False)
    assert (verdict.remove, verdict.owner) == (False, "unknown")


def test_a_young_created_container_of_a_stopped_server_is_removed_since_nobody_will_start_it() -> None:
    facts = _facts("a" * 16, state="created")
    dead = judge_container(facts, max_lifetime=600, now=time.time(), owner_alive=lambda _: False)
    live = judge_container(facts, max_lifetime=600, now=time.time(), owner_alive=lambda _: True)
    assert (dead.remove, dead.reason) == (True, "orphan of a stopped server")
    assert (live.remove, live.reason) == (False, "being created")


def test_a_stopped_or_expired_container_keeps_its_reason_whatever_its_owner() -> None:
    now = time.time()
    stopped = judge_container(_facts("a" * 16, state="exited"), max_lifetime=600, now=now, owner_alive=lambda _: False)
    expired = judge_container(_facts("a" * 16, expires_in=-5), max_lifetime=600, now=now, owner_alive=lambda _: False)
    assert (stopped.remove, stopped.reason, expired.remove, expired.reason) == (True, "stopped", True, "expired")


class _ListedEngine(MemoryEngine):
    """Lists the given containers and fails their removal, without a Docker engine."""

    def __init__(self, containers: list[ContainerFacts]) -> None:
        super().__init__()
        self.listed = containers
        self.fail("remove_container", SandboxError(ErrorCode.CONTAINER_REMOVAL_FAILED, "injected"), times=1000)

    def list_containers(self, label: str, *more_labels: str) -> list[ContainerFacts]:
        del label, more_labels
        return self.listed


def test_every_container_of_a_stopped_server_is_an_orphan_and_a_failed_removal_keeps_the_evidence(
    tmp_path: Path,
) -> None:
    owner = _killed_server(tmp_path)
    engine = _ListedEngine([_facts(owner), _facts(owner, state="created")])
    verdicts, failures = sweep_managed(engine, max_lifetime=600, state_dir=tmp_path)
    assert [(v.remove, v.owner) for v in verdicts] == [(True, "dead"), (True, "dead")]
    assert failures == 2
    # The marker survives, so the next sweep still knows these are orphans and tries again.
    assert [v.remove for v in survey_managed(engine, max_lifetime=600, state_dir=tmp_path)] == [True, True]


# -- against a real Docker engine ----------------------------------------------------------------------------------


class _ScopedEngine(ForwardingEngine):
    """Lists only the containers this test made, so its sweep can never touch anyone else's."""

    def __init__(self, engine: Engine, container_ids: set[str]) -> None:
        super().__init__(engine)
        self.container_ids = container_ids

    def list_containers(self, label: str, *more_labels: str) -> list[ContainerFacts]:
        return [c for c in super().list_containers(label, *more_labels) if c.id in self.container_ids]


@pytest.fixture
def created(engine: DockerEngine) -> Iterator[set[str]]:
    """The IDs of the containers a test made; removed afterwards, even when it fails, and nothing else."""
    ids: set[str] = set()
    yield ids
    for container_id in ids:
        with contextlib.suppress(SandboxError):
            engine.remove_container(container_id)


def _owned_container(engine: DockerEngine, image_id: str, owner: str, session: str, created: set[str]) -> str:
    request = ContainerRequest(
        image_id=image_id,
        command=["/usr/local/bin/node", "/opt/sandbox/watchdog.mjs", "120"],
        labels={
            LABEL_MANAGED: "true",
            TEST_LABEL: "1",
            LABEL_OWNER: owner,
            LABEL_SESSION: session,
            LABEL_EXPIRES_AT: str(int(time.time()) + 3600),
        },
        apparmor=engine.daemon_facts().apparmor,
    )
    container_id = engine.create_container(request)
    created.add(container_id)
    return container_id


@pytest.mark.docker
def test_sweep_removes_a_stopped_servers_running_container_and_keeps_a_live_servers(
    engine: DockerEngine, image_id: str, created: set[str], tmp_path: Path
) -> None:
    dead_owner = _killed_server(tmp_path)
    live = ServerMarker.acquire(tmp_path)
    try:
        orphan = _owned_container(engine, image_id, dead_owner, "orphan", created)
        peer = _owned_container(engine, image_id, live.owner, "peer", created)
        scoped = _ScopedEngine(engine, created)
        try:
            verdicts, failures = sweep_managed(scoped, max_lifetime=3600, state_dir=tmp_path)
        finally:
            scoped.close()
        assert failures == 0
        assert {v.container.id: (v.remove, v.owner) for v in verdicts} == {
            orphan: (True, "dead"),
            peer: (False, "live"),
        }
        assert engine.container_facts(orphan) is None
        facts = engine.container_facts(peer)
        assert facts is not None and facts.state == "running"
        # The stopped server has no container left, so its marker goes; the live one's stays.
        assert not _marker_path(tmp_path, dead_owner).exists()
        assert owner_alive(tmp_path, live.owner) is True
    finally:
        live.release()


@pytest.mark.docker
def test_a_tagged_sweep_judges_only_its_tag_and_keeps_the_evidence_for_a_stopped_servers_other_containers(
    engine: DockerEngine, image_id: str, created: set[str], tmp_path: Path
) -> None:
    dead_owner = _killed_server(tmp_path)
    other_tag = DockerEngine(labels={LABEL_TAG: WORKER_TAG + "-other"})
    try:
        ours = _owned_container(engine, image_id, dead_owner, "ours", created)
        theirs = _owned_container(other_tag, image_id, dead_owner, "theirs", created)
        scoped = _ScopedEngine(engine, created)
        try:
            verdicts, failures = sweep_managed(scoped, max_lifetime=3600, state_dir=tmp_path, tag=WORKER_TAG)
            assert ([v.container.id for v in verdicts], failures) == ([ours], 0)
            assert engine.container_facts(ours) is None
            assert engine.container_facts(theirs) is not None  # an orphan too, but another tag's to judge
            # The marker is the only evidence that "theirs" is an orphan: it stays while "theirs" exists.
            assert _marker_path(tmp_path, dead_owner).exists()
            verdicts, failures = sweep_managed(scoped, max_lifetime=3600, state_dir=tmp_path)
            assert [(v.container.id, v.owner) for v in verdicts] == [(theirs, "dead")] and failures == 0
            assert engine.container_facts(theirs) is None
            assert not _marker_path(tmp_path, dead_owner).exists()
        finally:
            scoped.close()
    finally:
        other_tag.close()


@pytest.mark.docker
def test_reap_dry_run_shows_whether_each_owner_is_live_and_would_remove_only_the_orphan(
    engine: DockerEngine, image_id: str, created: set[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    state_dir = default_state_dir()
    dead_owner = _killed_server(state_dir)
    live = ServerMarker.acquire(state_dir)
    try:
        tag = os.urandom(4).hex()
        orphan = _owned_container(engine, image_id, dead_owner, f"orphan-{tag}", created)
        peer = _owned_container(engine, image_id, live.owner, f"peer-{tag}", created)
        result = CliRunner().invoke(app, ["reap", "--dry-run"])
        assert result.exit_code == 0, result.output
        rows = {line.split()[0]: line for line in result.output.splitlines() if tag in line}
        assert re.search(r"\sdead\s+would remove \(orphan of a stopped server\)$", rows[f"orphan-{tag}"])
        assert re.search(r"\slive\s+kept \(live\)$", rows[f"peer-{tag}"])
        # A dry run changes nothing: both containers run, and the evidence is still there for the real reap.
        assert engine.container_facts(orphan) is not None and engine.container_facts(peer) is not None
        assert owner_alive(state_dir, dead_owner) is False
    finally:
        live.release()
