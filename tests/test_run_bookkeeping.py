"""The suite's own bookkeeping: what a run may clean up and report, and how serial tests are held apart."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.hardening import LABEL_MANAGED, LABEL_TAG, ContainerRequest
from code_sandbox.profile import Profile

from tests.conftest import WORKER_TAG
from tests.support.run import LOCKS, containers_of_run, hold_test_slot, remove_tagged, run_id, stray_files


@pytest.mark.docker
def test_the_run_cleans_and_reports_only_containers_it_tagged(
    engine: DockerEngine, profile: Profile, image_id: str
) -> None:
    def create(tag: str) -> str:
        labels = {LABEL_MANAGED: "true", LABEL_TAG: tag}
        command = [*profile.helper_argv("watchdog"), "60"]
        return engine.create_container(ContainerRequest(image_id, command, labels, engine.daemon_facts().apparmor))

    # The engine adds this worker's tag to every container; a plain engine stands in for another client.
    other_client = DockerEngine()
    foreign_request = ContainerRequest(
        image_id,
        [*profile.helper_argv("watchdog"), "60"],
        {LABEL_MANAGED: "true", LABEL_TAG: "tother-gw0"},
        engine.daemon_facts().apparmor,
    )
    foreign = other_client.create_container(foreign_request)
    try:
        ours = create("ignored: the engine's own tag wins")
        assert {c.id for c in containers_of_run(engine, run_id())} >= {ours}
        assert foreign not in {c.id for c in containers_of_run(engine, run_id())}
        assert remove_tagged(engine, WORKER_TAG) >= 1
        assert engine.container_facts(ours) is None
        facts = engine.container_facts(foreign)
        assert facts is not None and facts.state == "running"
    finally:
        other_client.remove_container(foreign)
        other_client.close()


def test_only_files_other_than_pytests_own_and_the_locks_count_as_left_behind(tmp_path: Path) -> None:
    (tmp_path / "pytest-of-root").mkdir()
    for name in LOCKS:
        (tmp_path / name).touch()
    assert stray_files(tmp_path) == []
    (tmp_path / "tmpabc123").mkdir()
    (tmp_path / "audit.jsonl").touch()
    assert stray_files(tmp_path) == ["audit.jsonl", "tmpabc123"]
    assert stray_files(tmp_path / "missing") == []


def _can_lock(path: Path, mode: int) -> bool:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_a_serial_test_excludes_every_other_test_and_tests_share_with_each_other(tmp_path: Path) -> None:
    gate, tests = tmp_path / LOCKS[0], tmp_path / LOCKS[1]
    with hold_test_slot(tmp_path, serial=False):
        assert _can_lock(tests, fcntl.LOCK_SH)  # another test may run beside this one
        assert not _can_lock(tests, fcntl.LOCK_EX)  # a serial one may not
        assert _can_lock(gate, fcntl.LOCK_EX)  # and may queue at the turnstile, which then stops new tests
    with hold_test_slot(tmp_path, serial=True):
        assert not _can_lock(gate, fcntl.LOCK_SH)  # no new test starts
        assert not _can_lock(tests, fcntl.LOCK_SH)  # and none runs
    assert _can_lock(tests, fcntl.LOCK_EX) and _can_lock(gate, fcntl.LOCK_EX)  # everything released


def test_the_run_id_and_worker_tag_name_this_run() -> None:
    assert WORKER_TAG.startswith(run_id() + "-")
    assert WORKER_TAG.endswith("-" + os.environ.get("PYTEST_XDIST_WORKER", "main"))
