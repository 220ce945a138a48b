"""A Docker engine of the worker's own, for tests that stop an engine or need one without the sandbox image.

It runs beside the shared engine with its own socket (and a TCP port on loopback served over TLS, with certificates
made for it), data-root, exec-root, pidfile and config file, no bridge, no
iptables rules and no IP forwarding, so it opens no network and touches nothing of the shared engine's. No registry
is reachable: an image comes from the shared engine (``docker save`` streamed into ``docker load``).

Use it through the session-scoped ``second_engine`` fixture (``tests/conftest.py`` loads this module as a plugin).
Each worker starts it at most once, on first use, and stops it for good (reaped, its directory removed) when the
worker ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from code_sandbox.docker_engine import DockerEngine, EngineAddress
from code_sandbox.hardening import LABEL_TAG

from tests.support.images import tag_image
from tests.support.run import remove_tagged, worker_tag
from tests.support.tls import make_certificates

START_SECONDS = 60
STOP_SECONDS = 60


class SecondEngine:
    """A ``dockerd`` this worker started, with everything it keeps under one directory of its own.

    The directory is short on purpose: containerd's sockets live under the exec-root, and a unix socket's path must
    fit in 108 bytes.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.socket = root / "docker.sock"
        self.base_url = f"unix://{self.socket}"
        self._log = root / "dockerd.log"
        self._process: subprocess.Popen[bytes] | None = None
        self.engine = DockerEngine(base_url=self.base_url, labels={LABEL_TAG: worker_tag()})
        """A client of this engine; its containers carry this worker's tag, like the shared ``engine`` fixture's."""
        self.certificates = make_certificates(root / "tls")
        self.port = _free_loopback_port()
        self.tls_environment = {
            "DOCKER_HOST": f"tcp://127.0.0.1:{self.port}",
            "DOCKER_TLS_VERIFY": "1",
            "DOCKER_CERT_PATH": str(self.certificates.client_dir),
        }
        """How a client reaches this engine over TLS, as a remote engine is reached: ``DOCKER_HOST`` and the rest."""

    def tls_engine(self, **options: Any) -> DockerEngine:
        """A client that reaches this engine through :attr:`tls_environment` only."""
        return DockerEngine(address=EngineAddress.from_environment(self.tls_environment), **options)

    def argv(self) -> list[str]:
        config = self.root / "daemon.json"
        if not config.exists():
            config.write_text("{}\n")  # not /etc/docker/daemon.json: that one is the shared engine's
        return [
            "dockerd",
            f"--config-file={config}",
            f"--host={self.base_url}",
            f"--host=tcp://127.0.0.1:{self.port}",
            "--tlsverify",
            f"--tlscacert={self.certificates.ca}",
            f"--tlscert={self.certificates.server_cert}",
            f"--tlskey={self.certificates.server_key}",
            f"--data-root={self.root / 'data'}",
            f"--exec-root={self.root / 'x'}",
            f"--pidfile={self.root / 'dockerd.pid'}",
            # Where a system containerd runs, dockerd uses it instead of starting its own: namespaces of this
            # engine's own keep it from sharing the shared engine's images and containers there.
            f"--containerd-namespace=code-sandbox-test-{worker_tag()}",
            f"--containerd-plugins-namespace=code-sandbox-test-{worker_tag()}-plugins",
            "--bridge=none",
            "--iptables=false",
            "--ip-forward=false",
            "--ip-masq=false",
        ]

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the daemon and wait, within a bound, until it answers."""
        assert self._process is None, "the second engine is already running"
        with self._log.open("ab") as log:
            # A session of its own: a Ctrl-C of the test run reaches pytest, whose teardown stops the daemon.
            # Its own TMPDIR under its root, which close() removes: a containerd slow to stop (a loaded machine)
            # dumps its stacks there, not among the run's files.
            scratch = self.root / "tmp"
            scratch.mkdir(exist_ok=True)
            environment = {**os.environ, "TMPDIR": str(scratch)}
            self._process = subprocess.Popen(
                self.argv(), stdout=log, stderr=log, start_new_session=True, env=environment
            )
        deadline = time.monotonic() + START_SECONDS
        # Probe the socket by hand until it listens: docker-py leaks the socket of every failed connect.
        while not _socket_answers(self.socket):
            if self._process.poll() is not None:
                self._reap()
                pytest.fail(f"the second engine exited at start:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the second engine did not listen within {START_SECONDS} s:\n{self.log_tail()}")
            time.sleep(0.05)
        self.engine.ping()

    def stop(self) -> None:
        """SIGTERM the daemon (it stops its containers, then its containerd) and reap it, within a bound."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                self._process = None
                pytest.fail(f"the second engine did not stop within {STOP_SECONDS} s:\n{self.log_tail()}")
        self._reap()

    def restart(self) -> None:
        """Stop and start again on the same data-root: images and containers stay what the daemon keeps."""
        self.stop()
        self.start()

    def provide_image(self, source: DockerEngine, image_id: str, tag: str) -> None:
        """Make ``tag`` name ``image_id`` here; the image is copied from ``source`` unless it is here already."""
        if self.engine.image_facts(image_id) is None:
            load_image(source, self.engine, image_id)
        tag_image(self.engine, image_id, tag)

    def close(self) -> None:
        """Stop the daemon for good; then nothing of it may be left: no process, no mount, no file."""
        left = remove_tagged(self.engine, worker_tag()) if self.running else 0
        self.engine.close()
        self.stop()
        deadline = time.monotonic() + STOP_SECONDS
        while processes := self.processes():  # containerd shims leave on their own once their container is gone
            if time.monotonic() > deadline:
                pytest.fail(f"processes of the second engine outlived it: {processes}")
            time.sleep(0.1)
        mounts = self.mounts()
        assert mounts == [], f"mounts of the second engine outlived it: {mounts}"
        shutil.rmtree(self.root)
        assert left == 0, f"{left} container(s) of this worker outlived their tests on the second engine"

    def processes(self) -> list[str]:
        """Command names of every process whose command line names this engine's directory (dockerd, containerd,
        shims)."""
        needle = str(self.root).encode()
        found: list[str] = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if needle in Path(f"/proc/{entry}/cmdline").read_bytes():
                        found.append(Path(f"/proc/{entry}/comm").read_text().strip())
        return found

    def mounts(self) -> list[str]:
        prefix = str(self.root) + "/"
        points = (line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())
        return [point for point in points if point.startswith(prefix)]

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def _reap(self) -> None:
        if self._process is not None:
            self._process.wait()
            self._process = None


def load_image(source: DockerEngine, target: DockerEngine, image_id: str) -> None:
    """Stream ``docker save`` of ``image_id`` from ``source`` into ``docker load`` on ``target``.

    Through :meth:`DockerEngine.api`, the SDK client, as no product code needs to copy images.
    """
    saved: Any = source.client().get_image(image_id)
    try:
        events: Iterator[dict[str, Any]] = target.client().load_image(saved)
        errors = [event for event in events if "error" in event or "errorDetail" in event]
    finally:
        saved.close()
    assert errors == [], errors
    assert target.image_facts(image_id) is not None, "the image did not arrive on the second engine"


def _free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick; the daemon binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _socket_answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


@pytest.fixture(scope="session")
def second_engine() -> Iterator[SecondEngine]:
    """This worker's own Docker engine, started on first use and stopped for good when the worker ends."""
    problem = (
        "the second engine needs root (as CI runs the suite)"
        if os.geteuid() != 0
        else "the second engine needs dockerd on PATH"
        if shutil.which("dockerd") is None
        else None
    )
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {problem}")
        pytest.skip(problem)
    # Under the run's temporary directory (TMPDIR), which the run's final check watches for leftovers.
    engine = SecondEngine(Path(tempfile.mkdtemp(prefix="engine-")))
    try:
        engine.start()
        yield engine
    finally:
        engine.close()
