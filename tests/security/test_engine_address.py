"""The wire to the engine: an address whose scheme the docker SDK reaches in plain text is refused whatever TLS
settings sit beside it, before a single byte is sent.

The engine here is the shared one, reached through a loopback forwarder that speaks plain HTTP to it, as a machine in
the middle would: if code-sandbox took ``http://`` with ``DOCKER_TLS_VERIFY`` at its word, it would talk to that
machine (and so to the engine) in the clear.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from code_sandbox.docker_engine import DockerEngine, EngineAddress
from code_sandbox.settings import SettingsError

from tests.support.proxy import Proxy
from tests.support.run import engine_command_env
from tests.support.tls import make_certificates
from tests.test_server import CLI

pytestmark = pytest.mark.docker

REFUSAL = (
    "code-sandbox: DOCKER_HOST is an http:// address, which is reached in plain text whatever the TLS settings say "
    "(use tcp:// or https://)\n"
)


@pytest.fixture
def forwarder(engine: DockerEngine) -> Iterator[Proxy]:
    """Plain TCP on loopback to the shared engine's unix socket, counting the connections it is offered."""
    url = engine.address.url
    if url is not None and not url.startswith("unix://"):
        pytest.fail("the shared engine must be reached through a unix socket for this test")
    with Proxy(url.removeprefix("unix://") if url else "/var/run/docker.sock") as forwarder:
        yield forwarder


@pytest.fixture
def tls_variables(tmp_path: Path) -> dict[str, str]:
    return {"DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": str(make_certificates(tmp_path / "tls").client_dir)}


def test_the_forwarder_reaches_the_engine_in_plain_text(forwarder: Proxy) -> None:
    """The premise: an http:// address without TLS settings does reach the engine through it (and is refused by
    code-sandbox as an engine anyone could pose as)."""
    import docker

    client = docker.APIClient(base_url=f"http://127.0.0.1:{forwarder.port}")
    try:
        assert client.ping()
    finally:
        client.close()
    assert forwarder.connections == 1


@pytest.mark.parametrize("scheme", ["http", "HTTP"])
def test_an_http_address_with_tls_variables_is_not_a_checked_engine(scheme: str, tls_variables: dict[str, str]) -> None:
    address = EngineAddress.from_environment({"DOCKER_HOST": f"{scheme}://127.0.0.1:9", **tls_variables})
    assert not address.checked
    with pytest.raises(SettingsError) as caught:
        address.require_checked()
    assert f"code-sandbox: {caught.value.message}\n" == REFUSAL
    for safe in ("tcp", "https"):
        assert EngineAddress.from_environment({"DOCKER_HOST": f"{safe}://127.0.0.1:9", **tls_variables}).checked


@pytest.mark.parametrize("command", ["serve", "run", "verify-image"])
def test_every_command_refuses_http_with_tls_variables_before_it_connects(
    command: str, forwarder: Proxy, tls_variables: dict[str, str]
) -> None:
    environment = engine_command_env({"DOCKER_HOST": f"http://127.0.0.1:{forwarder.port}", **tls_variables})
    arguments = {"run": ["examples/hello"]}.get(command, [])
    result = subprocess.run(
        [CLI, command, *arguments], env=environment, capture_output=True, text=True, timeout=60, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert (result.returncode, result.stderr, result.stdout) == (2, REFUSAL, "")
    assert forwarder.connections == 0


def test_doctor_fails_the_tls_row_and_does_not_contact_the_engine(
    forwarder: Proxy, tls_variables: dict[str, str]
) -> None:
    environment = engine_command_env(
        {"DOCKER_HOST": f"http://127.0.0.1:{forwarder.port}", **tls_variables}, audit_enabled="false"
    )
    result = subprocess.run(
        [CLI, "doctor"], env=environment, capture_output=True, text=True, timeout=120, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    tls = next(line for line in result.stdout.splitlines() if re.match(r"FAIL +tls ", line))
    assert "is an http:// address, which is reached in plain text" in tls, result.stdout
    assert "write the address as tcp://" in result.stdout
    assert re.search(r"^FAIL +docker +not contacted", result.stdout, re.MULTILINE), result.stdout
    assert forwarder.connections == 0
