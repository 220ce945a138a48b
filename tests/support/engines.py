"""Engines other than the shared local one, for the conformance suite: ``tls`` (the worker's second Docker engine,
reached over TLS on loopback through ``DOCKER_HOST``, as a remote engine is) and ``podman`` (a Podman API service of
the worker's own). ``CODE_SANDBOX_TEST_ENGINES`` (comma-separated; default ``tls,podman``; empty for none) picks
them. An engine that cannot run here fails in CI (``CI=true``) and is skipped elsewhere.

The Podman service keeps everything under a directory of its own (storage, run state, socket, configuration), so it
shares nothing with a Podman the developer uses, and the directory goes when the worker ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from code_sandbox.docker_engine import DockerEngine, EngineAddress
from code_sandbox.errors import SandboxError
from code_sandbox.hardening import LABEL_TAG

from tests.support.run import remove_tagged

TEST_ENGINES = tuple(name for name in os.environ.get("CODE_SANDBOX_TEST_ENGINES", "tls,podman").split(",") if name)
START_SECONDS = 60


def _unavailable(problem: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {problem}")
    pytest.skip(problem)


EXIT_COMMAND_DELAY = 10


def containers_conf(runtime: tuple[str, str] | None = None) -> str:
    """The service's configuration. An exec's two conmon processes wait :data:`EXIT_COMMAND_DELAY` seconds after it
    ends before they run its cleanup (Podman's default, 300, keeps hundreds of them alive through a run).

    The OCI runtime is ``runtime`` (name, binary) when given. Else, on a host with hybrid cgroups (v1 controllers
    beside a cgroup2 mount, as this kind of machine has), it is runc wherever runc is installed (the Docker engine
    brings it): Podman prefers crun when both are there, and crun refuses every container on such a host (``doctor``
    diagnoses that for an operator, as ``tests/test_engine_refusals.py`` shows). Elsewhere Podman's own choice
    stands."""
    lines = ["[engine]", f"exit_command_delay = {EXIT_COMMAND_DELAY}"]
    hybrid = Path("/sys/fs/cgroup/unified").is_dir()
    if runtime is None and hybrid and shutil.which("runc") is not None:
        lines.append('runtime = "runc"')
    elif runtime is not None:
        name, binary = runtime
        lines += [f'runtime = "{name}"', "[engine.runtimes]", f'{name} = ["{binary}"]']
    return "\n".join(lines) + "\n"


class PodmanService:
    """``podman system service`` on a socket of its own, with its own storage, run state and configuration
    (rootful)."""

    def __init__(self, root: Path, run_root: Path, *, runtime: tuple[str, str] | None = None) -> None:
        self.root = root
        self.runtime = runtime
        """The OCI runtime (name, binary) the service runs containers under; ``None``: :func:`containers_conf`'s."""
        self.run_root = run_root
        """Its run state: apart, since Podman refuses a run root longer than 50 characters."""
        self.socket = root / "podman.sock"
        self.environment = {"DOCKER_HOST": f"unix://{self.socket}"}
        self._log = root / "podman.log"
        self._config = root / "containers.conf"
        self._process: subprocess.Popen[bytes] | None = None

    def _podman_environment(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self._config)}

    def argv(self) -> list[str]:
        return [
            "podman",
            f"--root={self.root / 'storage'}",
            f"--runroot={self.run_root}",
            f"--tmpdir={self.root / 'tmp'}",
            "--cgroup-manager=cgroupfs",
            "--events-backend=none",
            "system",
            "service",
            "--time=0",
            f"unix://{self.socket}",
        ]

    def start(self) -> None:
        self._config.write_text(containers_conf(self.runtime))
        with self._log.open("ab") as log:
            self._process = subprocess.Popen(
                self.argv(), stdout=log, stderr=log, start_new_session=True, env=self._podman_environment()
            )
        deadline = time.monotonic() + START_SECONDS
        probe = DockerEngine(address=EngineAddress.from_environment(self.environment))
        try:
            while True:
                if self._process.poll() is not None:
                    pytest.fail(f"podman system service exited at start:\n{self.log_tail()}")
                if self.socket.exists():
                    with contextlib.suppress(SandboxError):
                        probe.ping()
                        return
                if time.monotonic() > deadline:
                    pytest.fail(f"podman system service did not answer within {START_SECONDS} s:\n{self.log_tail()}")
                time.sleep(0.1)
        finally:
            probe.close()

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def helpers(self) -> list[int]:
        """The service's conmon processes and the cleanup commands they run: every process but the service itself
        that names its storage or run state."""
        own = self._process.pid if self._process is not None else None
        marks = (str(self.root).encode(), str(self.run_root).encode())
        pids: list[int] = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != own:
                with contextlib.suppress(OSError):
                    command = Path(f"/proc/{entry}/cmdline").read_bytes()
                    if any(mark in command for mark in marks):
                        pids.append(int(entry))
        return pids

    def close(self) -> None:
        """Stop the service, then remove its storage (``podman system reset`` unmounts what it mounted).

        An exec's conmon processes outlive its container by the exit delay and then run a cleanup command that
        names this service's storage: they are waited for first, or that command would make the storage (and its
        mounts) again after it is gone."""
        deadline = time.monotonic() + EXIT_COMMAND_DELAY + 30
        while self._process is not None and self.helpers() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.stop()
        subprocess.run(
            [
                shutil.which("podman") or "podman",
                f"--root={self.root / 'storage'}",
                f"--runroot={self.run_root}",
                "system",
                "reset",
                "-f",
            ],
            capture_output=True,
            timeout=120,
            check=False,
            env=self._podman_environment(),
        )
        prefixes = (str(self.root) + "/", str(self.run_root) + "/")
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        assert [point for point in mounts if point.startswith(prefixes)] == [], (
            "mounts of the Podman service outlived it"
        )
        assert self.helpers() == [], f"processes of the Podman service outlived it:\n{self.log_tail()}"
        shutil.rmtree(self.root)
        if self.run_root.exists():  # the reset removes it
            shutil.rmtree(self.run_root)

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"


def podman_engine(tag: str, *, runtime: tuple[str, str] | None = None) -> Iterator[DockerEngine]:
    """A client of a Podman service of this worker's own, reached through ``DOCKER_HOST``; its containers carry
    ``tag``, and none of them, nor any of their volumes, may be left at the end. ``runtime`` (name, binary) is the
    service's OCI runtime, when given."""
    if os.geteuid() != 0:
        _unavailable("the Podman service of the tests runs rootful, which needs root (as CI runs the suite)")
    if shutil.which("podman") is None:
        _unavailable("podman is not installed")
    service = PodmanService(
        Path(tempfile.mkdtemp(prefix="podman-")), Path(tempfile.mkdtemp(prefix="podman-", dir="/run")), runtime=runtime
    )
    try:
        service.start()
        engine = DockerEngine(address=EngineAddress.from_environment(service.environment), labels={LABEL_TAG: tag})
        try:
            yield engine
        finally:
            left = remove_tagged(engine, tag)
            volumes = engine.sandbox_volumes(tag=tag)
            engine.remove_leftover_volumes(tag=tag, grace=0)
            engine.close()
            assert left == 0, f"{left} container(s) of this worker outlived their tests on Podman"
            assert not volumes, f"{len(volumes)} volume(s) of this worker outlived their containers on Podman"
    finally:
        service.close()
