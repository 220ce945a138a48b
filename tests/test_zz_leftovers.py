"""The last check of the suite: nothing the tests started is left behind.

pytest runs files in name order, so this file runs after every other test, the security suite included.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from code_sandbox.engine import DockerEngine
from code_sandbox.hardening import LABEL_MANAGED

from tests.conftest import TEST_LABEL, TMP_SNAPSHOT


@pytest.mark.docker
def test_no_managed_container_stray_process_or_stray_file_remains(
    engine: DockerEngine, tmp_path_factory: pytest.TempPathFactory
) -> None:
    assert engine.list_containers(f"{LABEL_MANAGED}=true") == []
    assert engine.list_containers(TEST_LABEL) == []
    # No process of ours outlives its test: every child of this pytest process has been reaped. The one
    # exception is a Docker daemon that the daemon-restart test started again in place of the one it stopped.
    children = [
        pid
        for pid in os.listdir("/proc")
        if pid.isdigit()
        and _parent_of(pid) == os.getpid()
        and _state_of(pid) not in ("Z", None)
        and Path(f"/proc/{pid}/comm").read_text().strip() != "dockerd"
    ]
    assert children == []
    # Nothing new in the system temp directory except pytest's own base directory.
    base = tmp_path_factory.getbasetemp().resolve()
    new_entries = {p for p in Path("/tmp").iterdir() if p.name not in TMP_SNAPSHOT}
    assert all(base == p or base.is_relative_to(p) for p in new_entries), sorted(map(str, new_entries))


def _parent_of(pid: str) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _state_of(pid: str) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
