"""Certificates for a Docker engine served over TLS on loopback: a throwaway CA, a server certificate for
127.0.0.1 and a client certificate, made by the ``openssl`` command (no shell) and valid for two days.

The client's directory is laid out as ``DOCKER_CERT_PATH`` expects it: ``ca.pem``, ``cert.pem``, ``key.pem``.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server_cert: Path
    server_key: Path
    client_dir: Path
    """``DOCKER_CERT_PATH`` for a client the engine trusts."""


def make_certificates(directory: Path, *, name: str = "code-sandbox-test") -> Certificates:
    """A CA and the server and client certificates it signs, under ``directory`` (created, private)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    client_dir = directory / "client"
    client_dir.mkdir(mode=0o700, exist_ok=True)
    ca, ca_key = directory / "ca.pem", directory / "ca-key.pem"
    _openssl("req", "-x509", *_KEY, "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", f"/CN={name}-ca")
    server_cert, server_key = directory / "server-cert.pem", directory / "server-key.pem"
    _sign(directory, ca, ca_key, server_cert, server_key, "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1\n"
          "extendedKeyUsage=serverAuth\n")  # fmt: skip
    _sign(directory, ca, ca_key, client_dir / "cert.pem", client_dir / "key.pem", f"/CN={name}-client",
          "extendedKeyUsage=clientAuth\n")  # fmt: skip
    (client_dir / "ca.pem").write_bytes(ca.read_bytes())
    return Certificates(ca, server_cert, server_key, client_dir)


def _sign(directory: Path, ca: Path, ca_key: Path, cert: Path, key: Path, subject: str, extensions: str) -> None:
    request, extfile = directory / f"{cert.stem}.csr", directory / f"{cert.stem}.ext"
    extfile.write_text(extensions)
    _openssl("req", "-new", *_KEY, "-keyout", key, "-out", request, "-subj", subject)
    _openssl("x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
             "-days", "2", "-extfile", extfile)  # fmt: skip
    key.chmod(0o600)


def _openssl(*arguments: str | Path) -> None:
    openssl = shutil.which("openssl")
    assert openssl is not None, "the tests' TLS engine needs the openssl command"
    subprocess.run([openssl, *map(str, arguments)], check=True, capture_output=True, timeout=60)
