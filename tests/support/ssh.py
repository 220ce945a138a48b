"""An engine host reached over ssh, on loopback: an ``sshd`` of the test's own (its own port on 127.0.0.1, host
key, authorized key, pid file; password and forwarding off) whose sessions run ``docker system dial-stdio`` against
the worker's second engine, as ``DOCKER_HOST=ssh://root@host`` does against a remote one.

The client side is a home directory of the test's own: ``.ssh/id_ed25519`` and ``.ssh/known_hosts`` naming the host
key, so nothing of the developer's ``~/.ssh`` is read or changed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

START_SECONDS = 30
PRIVILEGE_SEPARATION = Path("/run/sshd")  # compiled into Debian's sshd


class SshEngineHost:
    def __init__(self, root: Path, engine_socket: Path) -> None:
        self.root = root
        self.home = root / "home"
        self._process: subprocess.Popen[bytes] | None = None
        self._log = root / "sshd.log"
        self.port = _free_port()
        ssh = self.home / ".ssh"
        ssh.mkdir(mode=0o700, parents=True)
        keygen = _tool("ssh-keygen")
        for key in (root / "host_key", ssh / "id_ed25519"):
            subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30)
        (root / "authorized_keys").write_text((ssh / "id_ed25519.pub").read_text())
        host_key = (root / "host_key.pub").read_text().split()
        (ssh / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {host_key[0]} {host_key[1]}\n")
        self.config = root / "sshd_config"
        self.config.write_text(
            "\n".join([
                f"Port {self.port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {root / 'host_key'}",
                f"PidFile {root / 'sshd.pid'}",
                f"AuthorizedKeysFile {root / 'authorized_keys'}",
                "AllowUsers root",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "AllowTcpForwarding no",
                "AllowStreamLocalForwarding no",
                "X11Forwarding no",
                "PermitTunnel no",
                "MaxSessions 64",  # as the README asks of an engine's host: sandboxes hold channels
                f"SetEnv DOCKER_HOST=unix://{engine_socket}",
                "",
            ])
        )  # fmt: skip
        self.environment = {"DOCKER_HOST": f"ssh://root@127.0.0.1:{self.port}", "HOME": str(self.home)}
        """How a client reaches the engine: ``DOCKER_HOST``, and the home directory holding its key and known hosts."""

    def start(self) -> None:
        with self._log.open("ab") as log:
            self._process = subprocess.Popen(
                [_tool("sshd"), "-D", "-e", "-f", str(self.config)], stdout=log, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + START_SECONDS
        while not _listens(self.port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the test's sshd did not start:\n{self._log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # sshd and the sessions it forked
            process.wait(timeout=30)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root)


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    assert found is not None, f"{name} is not installed (the openssh-server package)"
    return found


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _listens(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False
