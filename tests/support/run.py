"""What one test run owns: its id, each worker's container tag, its temporary directory, and what it left behind.

The controller (or the only process, without xdist) picks a run id and a temporary directory before any worker
starts; workers inherit both through the environment. Every container a worker makes carries
``io.code-sandbox.tag=<run>-<worker>``, so a worker cleans up only its own and the final check finds only this run's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from collections.abc import Generator, Mapping
from pathlib import Path

from code_sandbox.docker_engine import DockerEngine
from code_sandbox.engine import ContainerFacts
from code_sandbox.errors import SandboxError
from code_sandbox.hardening import LABEL_MANAGED, LABEL_TAG

RUN_ENV = "CODE_SANDBOX_TEST_RUN"
RUN_DIR_ENV = "CODE_SANDBOX_TEST_RUN_DIR"
LOCKS = ("serial-gate.lock", "serial-tests.lock", "image.lock", "image-verified")
"""The run's own files in its directory: the serial gate's locks (:func:`hold_test_slot`), :func:`image_lock`, and
the image ID that a worker verified for the run."""


def new_run_id() -> str:
    return "t" + secrets.token_hex(4)


def run_id() -> str:
    return os.environ.get(RUN_ENV) or "tsolo"


def worker_tag(suffix: str = "") -> str:
    """This worker's container tag: ``<run>-<worker>`` (``main`` without xdist), plus an optional suffix."""
    tag = f"{run_id()}-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    return f"{tag}-{suffix}" if suffix else tag


def command_env(**settings: str) -> dict[str, str]:
    """The environment for a ``code-sandbox`` subprocess: none of the caller's settings, this worker's tag, and
    ``settings`` as ``CODE_SANDBOX_<NAME>`` variables."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("CODE_SANDBOX_")}
    env["CODE_SANDBOX_TAG"] = worker_tag()
    env.update({f"CODE_SANDBOX_{key.upper()}": value for key, value in settings.items()})
    return env


def engine_command_env(engine: Mapping[str, str], **settings: str) -> dict[str, str]:
    """:func:`command_env` for another engine: ``engine`` (``DOCKER_*`` variables, and any the client needs, such as
    ``HOME`` for ssh) says where it is, instead of the caller's ``DOCKER_*``."""
    environment = {key: value for key, value in command_env(**settings).items() if not key.startswith("DOCKER_")}
    return environment | dict(engine)


def containers_of_run(engine: DockerEngine, run: str) -> list[ContainerFacts]:
    """Every container on the engine whose tag says this run made it (any worker, any suffix)."""
    return [c for c in engine.list_containers(LABEL_TAG) if c.labels.get(LABEL_TAG, "").startswith(run + "-")]


def worker_containers(engine: DockerEngine) -> list[ContainerFacts]:
    """The managed containers this worker's tests made, servers in subprocesses included."""
    return engine.list_containers(f"{LABEL_MANAGED}=true", f"{LABEL_TAG}={worker_tag()}")


def remove_tagged(engine: DockerEngine, tag: str) -> int:
    """Remove every container tagged exactly ``tag``; returns how many there were."""
    containers = engine.list_containers(f"{LABEL_TAG}={tag}")
    for container in containers:
        with contextlib.suppress(SandboxError):
            engine.remove_container(container.id)
    return len(containers)


def stray_files(run_dir: Path) -> list[str]:
    """Entries of the run's temporary directory other than pytest's own ``pytest-of-<user>`` tree and the locks."""
    if not run_dir.is_dir():
        return []
    return sorted(
        entry.name for entry in run_dir.iterdir() if not entry.name.startswith("pytest-of-") and entry.name not in LOCKS
    )


def live_children(pid: int) -> list[str]:
    """The command names of ``pid``'s children that are still running (not zombies)."""
    names: list[str] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                names.append(Path(f"/proc/{entry}/comm").read_text().strip())
    return names


@contextlib.contextmanager
def hold_test_slot(run_dir: Path, *, serial: bool) -> Generator[None]:
    """Hold a slot to run one test: shared with every other test, or, for a serial test, alone.

    A reader-writer lock (flock on ``serial-tests.lock``) with a turnstile in front (``serial-gate.lock``): a serial
    test takes the turnstile first, so no new test starts while it waits for the running ones to finish.
    """
    gate_path, tests_path = run_dir / LOCKS[0], run_dir / LOCKS[1]
    gate = os.open(gate_path, os.O_RDWR | os.O_CREAT, 0o600)
    tests = os.open(tests_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(gate, fcntl.LOCK_EX if serial else fcntl.LOCK_SH)
        fcntl.flock(tests, fcntl.LOCK_EX if serial else fcntl.LOCK_SH)
        if not serial:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield
    finally:
        os.close(tests)
        os.close(gate)


@contextlib.contextmanager
def image_lock() -> Generator[Path]:
    """Held while a worker verifies, and if need be builds, the sandbox image: one worker at a time. Yields the
    file where the run records the image ID that passed (an ID names its content, so one check serves the run)."""
    run_dir = Path(os.environ[RUN_DIR_ENV])
    fd = os.open(run_dir / LOCKS[2], os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield run_dir / LOCKS[3]
    finally:
        os.close(fd)
