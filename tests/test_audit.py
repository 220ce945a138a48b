"""The audit log refuses whatever is planted at its path, never blocks a caller and keeps its queue bounded."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import threading
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest
from code_sandbox.doctor import Finding, _check_audit_log  # pyright: ignore[reportPrivateUsage]
from code_sandbox.sandbox import audit
from code_sandbox.sandbox.audit import AuditLog, UnsafeAuditFileError, open_audit_file
from code_sandbox.settings import Settings

# Generous bounds for what should take milliseconds; a test that reaches one has found a hang.
PROMPT = 10.0


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "audit.jsonl"


def record(log: AuditLog, tool: str = "list_files") -> None:
    log.record(tool=tool, session_hash="abc", result="OK", duration_ms=1, counts={"files": 2})


def finishes_within(seconds: float, action: Callable[[], object]) -> bool:
    """Run ``action`` in a daemon thread, so a test that hangs fails instead of hanging the run."""
    worker = threading.Thread(target=action, daemon=True)
    worker.start()
    worker.join(seconds)
    return not worker.is_alive()


def audit_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == audit.__name__ and r.levelno == logging.WARNING]


def assert_each_warning_once(caplog: pytest.LogCaptureFixture) -> None:
    """A flood of records gives one warning that writes fail and, when the bound was hit, one that records drop."""
    warnings = audit_warnings(caplog)
    assert 1 <= len(warnings) == len(set(warnings)) <= 2


def plant_fifo(path: Path) -> Path:
    path.parent.mkdir(mode=0o700, parents=True)
    os.mkfifo(path, 0o600)
    return path


@contextlib.contextmanager
def fifo_reader(path: Path) -> Generator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def released_on_failure(path: Path) -> Generator[None]:
    """A writer stuck opening a FIFO (the bug under test) is released by a reader, so it cannot outlive the test."""
    try:
        yield
    finally:
        with fifo_reader(path):
            pass


def test_a_normal_run_creates_a_private_audit_file_of_json_lines(path: Path) -> None:
    log = AuditLog(path, enabled=True)
    record(log, "create_sandbox")
    record(log, "write_files")
    log.close(timeout=PROMPT)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["tool"] for r in records] == ["create_sandbox", "write_files"]
    assert records[0]["files"] == 2


def test_a_symlink_planted_at_the_path_is_not_followed_and_its_target_is_unchanged(
    path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = tmp_path / "victim"
    target.write_text("original\n")
    target.chmod(0o600)
    path.parent.mkdir(mode=0o700)
    path.symlink_to(target)
    with pytest.raises(UnsafeAuditFileError):
        open_audit_file(path)
    log = AuditLog(path, enabled=True)
    record(log)
    record(log)
    log.close(timeout=PROMPT)
    assert target.read_text() == "original\n"
    assert path.is_symlink()
    warnings = audit_warnings(caplog)
    assert len(warnings) == 1
    assert str(tmp_path) not in warnings[0]


def test_a_fifo_with_no_reader_blocks_neither_record_nor_close(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    plant_fifo(path)
    log = AuditLog(path, enabled=True, max_queued=100)
    with released_on_failure(path):
        assert finishes_within(PROMPT, lambda: [record(log) for _ in range(5000)])
        assert finishes_within(PROMPT, lambda: log.close(timeout=PROMPT))
    assert stat.S_ISFIFO(path.lstat().st_mode)
    assert_each_warning_once(caplog)


def test_a_fifo_with_a_reader_is_refused_and_receives_nothing(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    plant_fifo(path)
    with fifo_reader(path) as reader:
        with pytest.raises(UnsafeAuditFileError):
            open_audit_file(path)
        log = AuditLog(path, enabled=True, max_queued=100)
        assert finishes_within(PROMPT, lambda: [record(log) for _ in range(5000)])
        assert finishes_within(PROMPT, lambda: log.close(timeout=PROMPT))
        assert os.read(reader, 65536) == b""  # end of file: no writer holds it open and nothing was written
    assert_each_warning_once(caplog)


def test_a_hard_link_planted_at_the_path_is_refused_and_its_other_name_unchanged(path: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-private-file"
    other.write_text("mine\n")
    other.chmod(0o600)
    path.parent.mkdir(mode=0o700)
    os.link(other, path)
    with pytest.raises(UnsafeAuditFileError):
        open_audit_file(path)
    log = AuditLog(path, enabled=True)
    record(log)
    log.close(timeout=PROMPT)
    assert other.read_text() == "mine\n"


def test_an_audit_file_readable_by_others_is_refused_and_left_unchanged(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path.parent.mkdir(mode=0o700)
    path.write_text("")
    path.chmod(0o644)
    with pytest.raises(UnsafeAuditFileError):
        open_audit_file(path)
    log = AuditLog(path, enabled=True)
    record(log)
    log.close(timeout=PROMPT)
    assert path.read_text() == ""
    assert len(audit_warnings(caplog)) == 1


def test_an_audit_file_owned_by_another_user_is_refused(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path.parent.mkdir(mode=0o700)
    path.write_text("")
    path.chmod(0o600)
    someone_else = os.geteuid() + 1
    monkeypatch.setattr(os, "geteuid", lambda: someone_else)
    with pytest.raises(UnsafeAuditFileError):
        open_audit_file(path)


def test_a_directory_at_the_path_is_refused_with_one_generic_warning(
    path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path.mkdir(parents=True)
    with pytest.raises(UnsafeAuditFileError):
        open_audit_file(path)
    log = AuditLog(path, enabled=True)
    record(log)
    record(log)
    log.close(timeout=PROMPT)
    assert list(path.iterdir()) == []
    warnings = audit_warnings(caplog)
    assert len(warnings) == 1
    assert str(tmp_path) not in warnings[0]


class GatedOpen:
    """Stands in for open_audit_file and holds the writer inside it until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()
        self.writers: list[threading.Thread] = []

    def __call__(self, path: Path) -> int:
        self.writers.append(threading.current_thread())
        self.entered.set()
        self.released.wait(PROMPT)
        return open_audit_file(path)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[GatedOpen]:
    gated = GatedOpen()
    monkeypatch.setattr(audit, "open_audit_file", gated)
    try:
        yield gated
    finally:
        gated.released.set()


def test_records_past_the_queue_bound_are_dropped_without_blocking_and_counted(
    path: Path, gate: GatedOpen, caplog: pytest.LogCaptureFixture
) -> None:
    log = AuditLog(path, enabled=True, max_queued=3)
    record(log, "first")
    assert gate.entered.wait(PROMPT)  # the writer holds "first"; the queue is empty
    assert finishes_within(PROMPT, lambda: [record(log, f"tool{i}") for i in range(10)])
    assert log.dropped == 7
    gate.released.set()
    log.close(timeout=PROMPT)
    assert [json.loads(line)["tool"] for line in path.read_text().splitlines()] == ["first", "tool0", "tool1", "tool2"]
    assert len(audit_warnings(caplog)) == 1


def test_close_returns_within_its_timeout_when_the_queue_is_full_and_the_writer_is_stuck(
    path: Path, gate: GatedOpen
) -> None:
    log = AuditLog(path, enabled=True, max_queued=2)
    record(log, "first")
    assert gate.entered.wait(PROMPT)
    for _ in range(5):
        record(log)
    assert finishes_within(PROMPT, lambda: log.close(timeout=0.1))
    gate.released.set()
    writer = gate.writers[0]
    writer.join(PROMPT)
    assert not writer.is_alive()  # told to stop, it did not stay behind waiting for a stop it could not be sent


def check_audit_log(path: Path) -> Finding:
    findings: list[Finding] = []
    _check_audit_log(findings, Settings(audit_log=path))
    [finding] = findings
    return finding


def test_doctor_passes_a_free_path_and_creates_a_private_file(path: Path) -> None:
    assert check_audit_log(path).passed
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_doctor_fails_a_planted_symlink_without_following_it(path: Path, tmp_path: Path) -> None:
    target = tmp_path / "victim"
    path.parent.mkdir(mode=0o700)
    path.symlink_to(target)  # dangling: following it would create the target
    finding = check_audit_log(path)
    assert not finding.passed
    assert finding.fix
    assert not target.exists()


def test_doctor_fails_a_fifo_without_blocking(path: Path) -> None:
    plant_fifo(path)
    findings: list[Finding] = []
    with released_on_failure(path):
        assert finishes_within(PROMPT, lambda: _check_audit_log(findings, Settings(audit_log=path)))
    assert [finding.passed for finding in findings] == [False]


def test_doctor_fails_an_audit_file_readable_by_others(path: Path) -> None:
    path.parent.mkdir(mode=0o700)
    path.write_text("")
    path.chmod(0o644)
    assert not check_audit_log(path).passed
