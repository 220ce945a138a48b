"""An engine on another host: how its address is worked out, TLS, its clock, a lost connection, and several servers
sharing it. "Another host" is the worker's second Docker engine, reached over TLS on loopback through
``DOCKER_HOST``, with a state directory of its own per server (so that no server sees another's liveness marker)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import anyio
import pytest
from code_sandbox.docker_engine import DockerEngine, EngineAddress
from code_sandbox.engine import DaemonFacts
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import (
    LABEL_EXPIRES_AT,
    LABEL_HOST,
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_PROFILE,
    LABEL_SESSION,
    LABEL_TAG,
    ContainerRequest,
)
from code_sandbox.image import build_offline_image
from code_sandbox.profile import Profile
from code_sandbox.sandbox import snapshots
from code_sandbox.sandbox.execution import run_entrypoint
from code_sandbox.sandbox.sessions import SessionManager
from code_sandbox.sandbox.snapshot_store import SnapshotStore
from code_sandbox.sandbox.sweep import survey_managed
from code_sandbox.sandbox.workspace import write_files
from code_sandbox.settings import Settings, SettingsError
from docker.context import ContextAPI
from docker.tls import TLSConfig
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.support.forwarding_engine import ForwardingEngine
from tests.support.output import errors_of_a_run_broken_by
from tests.support.proxy import Proxy
from tests.support.run import engine_command_env, worker_containers, worker_tag
from tests.support.second_engine import SecondEngine
from tests.support.ssh import PRIVILEGE_SEPARATION, SshEngineHost
from tests.support.tls import make_certificates
from tests.test_server import CLI, ok

# -- the address, from the environment (no engine needed) ----------------------------------------------------------


@pytest.fixture
def cert_dir(tmp_path: Path) -> Path:
    return make_certificates(tmp_path / "tls").client_dir


def test_docker_host_with_tls_verify_and_a_cert_path_gives_a_verified_tls_address(cert_dir: Path) -> None:
    address = EngineAddress.from_environment(
        {"DOCKER_HOST": "tcp://127.0.0.1:2376", "DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": str(cert_dir)}
    )
    assert (address.url, address.origin, address.tls_verify, address.local) == (
        "tcp://127.0.0.1:2376", "DOCKER_HOST", True, False
    )  # fmt: skip
    assert address.tls is not None and address.tls.cert == (str(cert_dir / "cert.pem"), str(cert_dir / "key.pem"))


def test_a_cert_path_without_its_files_is_a_settings_error_that_names_what_is_missing_but_not_the_path(
    cert_dir: Path,
) -> None:
    (cert_dir / "key.pem").unlink()
    with pytest.raises(SettingsError) as caught:
        EngineAddress.from_environment(
            {"DOCKER_HOST": "tcp://127.0.0.1:2376", "DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": str(cert_dir)}
        )
    assert caught.value.code == ErrorCode.SETTINGS_INVALID
    assert "key.pem" in caught.value.message and str(cert_dir) not in caught.value.message


@pytest.mark.parametrize(
    ("host", "words"),
    [
        ("fd://", "unix://, tcp://"),
        ("tcp-ish://x", "unix://, tcp://"),
        ("127.0.0.1:2376", "unix://, tcp://"),
        ("tcp://127.0.0.1:99999", "unix://, tcp://"),
        ("tcp://[::1", "unix://, tcp://"),
    ],
)
def test_an_address_code_sandbox_cannot_use_is_refused_without_echoing_it(host: str, words: str) -> None:
    with pytest.raises(SettingsError) as caught:
        EngineAddress.from_environment({"DOCKER_HOST": host})
    assert words in caught.value.message and host not in caught.value.message


def test_an_engine_anyone_on_the_way_could_pose_as_is_refused_before_any_connection(cert_dir: Path) -> None:
    for environment in (
        {"DOCKER_HOST": "tcp://127.0.0.1:9"},
        {"DOCKER_HOST": "tcp://127.0.0.1:9", "DOCKER_CERT_PATH": str(cert_dir)},  # TLS, the engine unchecked
    ):
        engine = DockerEngine(address=EngineAddress.from_environment(environment))
        with pytest.raises(SettingsError) as caught:
            engine.ping()
        assert caught.value.message.startswith("DOCKER_HOST reaches the engine without TLS that checks its certificate")
    assert EngineAddress.from_environment({"DOCKER_HOST": "ssh://root@127.0.0.1:9"}).checked


def test_the_address_shown_has_no_credentials() -> None:
    address = EngineAddress.from_environment({"DOCKER_HOST": "tcp://user:s3cret@engine.example:2376/?token=abc"})
    assert address.shown() == "tcp://engine.example:2376/"
    assert EngineAddress.from_environment({"DOCKER_HOST": "unix:///run/user/1000/docker.sock"}).local


@pytest.mark.docker
def test_without_docker_host_the_docker_context_in_use_reaches_the_engine(
    remote: SecondEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "docker-config"
    config.mkdir()
    (config / "config.json").write_text("{}")  # without it, the SDK keeps its contexts under the working directory
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    client = remote.certificates.client_dir
    tls = TLSConfig(
        client_cert=(str(client / "cert.pem"), str(client / "key.pem")), ca_cert=str(client / "ca.pem"), verify=True
    )
    ContextAPI.create_context("sandboxes", host=f"tcp://127.0.0.1:{remote.port}", tls_cfg=tls)
    assert EngineAddress.from_environment({}).origin == "default"  # no current context yet: the local socket
    address = EngineAddress.from_environment({"DOCKER_CONTEXT": "sandboxes"})
    assert (address.shown(), address.origin, address.tls_verify) == (
        f"https://127.0.0.1:{remote.port}", "Docker context sandboxes", True
    )  # fmt: skip
    ContextAPI.set_current_context("sandboxes")
    engine = DockerEngine(address=EngineAddress.from_environment({}))
    try:
        assert engine.daemon_facts().product == "Docker Engine"  # over TLS, checked against the context's CA
        assert engine.address.origin == "Docker context sandboxes"
    finally:
        engine.close()
    with pytest.raises(SettingsError) as caught:
        EngineAddress.from_environment({"DOCKER_CONTEXT": "nowhere"})
    assert caught.value.message.startswith("DOCKER_CONTEXT names a Docker context that does not exist")
    # A context that keeps only a CA still checks the engine against it (as the docker CLI does), never plain HTTP.
    ca_only = TLSConfig(ca_cert=str(client / "ca.pem"), verify=True)
    ContextAPI.create_context("ca-only", host=f"tcp://127.0.0.1:{remote.port}", tls_cfg=ca_only)
    address = EngineAddress.from_environment({"DOCKER_CONTEXT": "ca-only"})
    assert address.tls is not None and address.tls_verify and address.checked
    assert address.tls.cert is None and address.shown().startswith("https://")


@pytest.mark.parametrize("command", ["serve", "run", "build-image", "verify-image", "reap"])
def test_every_command_stops_at_once_on_an_unusable_tls_set_up_with_one_line_and_exit_2(
    command: str, tmp_path: Path
) -> None:
    secret_dir = tmp_path / "no-such-certs"
    environment = engine_command_env(
        {"DOCKER_HOST": "tcp://127.0.0.1:9", "DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": str(secret_dir)}
    )
    arguments = {"run": ["examples/hello"], "build-image": ["--offline"]}.get(command, [])
    result = subprocess.run(
        [CLI, command, *arguments], env=environment, capture_output=True, text=True, timeout=60, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        "code-sandbox: DOCKER_CERT_PATH must be a directory holding ca.pem, cert.pem and key.pem "
        "(missing: ca.pem, cert.pem, key.pem)\n"
    )
    assert result.stdout == ""


# -- a real engine over TLS ----------------------------------------------------------------------------------------

pytest_docker = pytest.mark.docker


@pytest.fixture
def remote(second_engine: SecondEngine, engine: DockerEngine, profile: Profile, image_id: str) -> SecondEngine:
    """The second engine, holding the verified sandbox image, as a remote engine."""
    second_engine.provide_image(engine, image_id, profile.image_spec().tag)
    return second_engine


@pytest.fixture
def remote_engine(remote: SecondEngine, image_id: str, profile: Profile) -> Iterator[DockerEngine]:
    engine = remote.tls_engine(labels={LABEL_TAG: worker_tag()})
    engine.verified_images.add((profile.name, image_id))
    yield engine
    engine.close()


@pytest_docker
def test_the_engines_ca_is_the_one_in_the_cert_path_whatever_requests_bundle_the_environment_names(
    remote: SecondEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = make_certificates(tmp_path / "other", name="unrelated")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(other.ca))  # requests would put this in place of ca.pem
    monkeypatch.setenv("CURL_CA_BUNDLE", str(other.ca))
    engine = remote.tls_engine()
    try:
        assert engine.daemon_facts().product == "Docker Engine"
    finally:
        engine.close()


@pytest_docker
def test_an_engine_whose_certificate_our_ca_did_not_sign_is_unavailable_with_a_tls_hint(
    remote: SecondEngine, tmp_path: Path
) -> None:
    other = make_certificates(tmp_path / "other", name="unrelated")
    error = _unreachable({**remote.tls_environment, "DOCKER_CERT_PATH": str(other.client_dir)})
    assert (error.code, error.message) == (
        ErrorCode.CONTAINER_UNAVAILABLE,
        "the TLS connection to the Docker engine failed",
    )
    assert error.hint is not None and "DOCKER_CERT_PATH" in error.hint


def _unreachable(environment: dict[str, str]) -> SandboxError:
    """The error an engine reached through ``environment`` gives at its first call."""
    engine = DockerEngine(address=EngineAddress.from_environment(environment))
    try:
        with pytest.raises(SandboxError) as caught:
            engine.ping()
    finally:
        engine.close()
    return caught.value


def _doctor_rows(environment: dict[str, str]) -> dict[str, str]:
    result = subprocess.run(
        [CLI, "doctor"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env=engine_command_env(environment, audit_enabled="false"),
    )
    rows: dict[str, str] = {}
    name = ""
    for line in result.stdout.splitlines():
        if line.startswith(("PASS ", "FAIL ")):
            status, name, detail = [*re.split(r"\s{2,}", line, maxsplit=2), ""][:3]
            rows[name] = f"{status} {detail}"
        elif name:
            rows[name] += " " + line.strip()  # the fix, on the lines below
    return rows


@pytest_docker
def test_doctor_names_the_remote_engine_and_passes_its_tls_set_up(remote: SecondEngine) -> None:
    rows = _doctor_rows(remote.tls_environment)
    port = remote.port
    assert re.match(rf"PASS Docker Engine \S+ at tcp://127\.0\.0\.1:{port} \(DOCKER_HOST\): Linux containers, ",
                    rows["docker"]), rows  # fmt: skip
    assert rows["tls"].startswith("PASS"), rows
    assert rows["hardening enforced"].startswith("PASS") and rows["image"].startswith("PASS"), rows


@pytest_docker
def test_doctor_fails_tls_that_does_not_check_the_engine_and_an_engine_reached_without_tls(
    remote: SecondEngine,
) -> None:
    unverified = {key: value for key, value in remote.tls_environment.items() if key != "DOCKER_TLS_VERIFY"}
    rows = _doctor_rows(unverified)
    assert rows["tls"].startswith("FAIL") and "DOCKER_TLS_VERIFY=1" in rows["tls"], rows
    assert rows["docker"].startswith("FAIL not contacted"), rows  # code-sandbox will not use it either
    rows = _doctor_rows({"DOCKER_HOST": remote.tls_environment["DOCKER_HOST"]})
    assert rows["tls"].startswith("FAIL") and "without TLS" in rows["tls"], rows
    assert rows["docker"].startswith("FAIL not contacted"), rows


class _OtherArchitecture(ForwardingEngine):
    """The shared engine, saying it runs the other architecture: a fault no engine here can show on demand."""

    def daemon_facts(self) -> DaemonFacts:
        facts = super().daemon_facts()
        return replace(facts, architecture="aarch64" if facts.architecture == "x86_64" else "x86_64")


@pytest_docker
def test_build_image_refuses_an_engine_of_another_architecture_before_building_anything(
    engine: DockerEngine, profile: Profile
) -> None:
    other = _OtherArchitecture(engine)
    before = engine.image_facts(profile.image_spec().tag)
    steps: list[str] = []
    try:
        with pytest.raises(SandboxError) as caught:
            build_offline_image(other, profile, runtime=None, progress=steps.append)
    finally:
        other.close()
    assert caught.value.code == ErrorCode.IMAGE_BUILD_FAILED
    there, here = other.daemon_facts().architecture, engine.daemon_facts().architecture
    assert caught.value.message == f"the Docker engine runs {there} but this machine is {here}"
    assert steps == [] and engine.image_facts(profile.image_spec().tag) == before


@pytest.fixture
def ssh_host(remote: SecondEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshEngineHost]:
    """The second engine's host, reached over ssh (an sshd of the test's own on loopback)."""
    if not PRIVILEGE_SEPARATION.is_dir() or shutil.which("sshd", path="/usr/sbin:/usr/bin") is None:
        problem = "sshd (openssh-server) and its /run/sshd are needed for the ssh:// tests"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {problem}")
        pytest.skip(problem)
    host = SshEngineHost(Path(tempfile.mkdtemp(prefix="ssh-")), remote.socket)
    try:
        host.start()
        yield host
    finally:
        host.close()


@pytest_docker
@pytest.mark.anyio
async def test_a_sandbox_works_on_an_engine_reached_over_ssh(
    ssh_host: SshEngineHost, profile: Profile, image_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", ssh_host.environment["HOME"])  # its key and known_hosts, not the developer's
    engine = DockerEngine(
        address=EngineAddress.from_environment(ssh_host.environment), labels={LABEL_TAG: worker_tag()}
    )
    engine.verified_images.add((profile.name, image_id))
    manager = SessionManager(engine, profile, Settings(max_sessions=1, default_timeout=20, max_timeout=60))
    try:
        session = await manager.create()
        await write_files(manager, session.id, [("hi.js", "console.log('over ssh', 6 * 7)")], overwrite=False)
        result = await run_entrypoint(manager, session.id, "hi.js", [], timeout_seconds=20)
        assert (result.stdout, result.exit_code) == ("over ssh 42\n", 0)
        assert engine.address.shown() == f"ssh://127.0.0.1:{ssh_host.port}"  # no user name
        assert await manager.destroy(session.id)
    finally:
        await manager.shutdown()
        engine.close()


@pytest_docker
@pytest.mark.anyio
async def test_a_snapshot_is_kept_and_restored_on_an_engine_reached_over_ssh(
    ssh_host: SshEngineHost, profile: Profile, image_id: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", ssh_host.environment["HOME"])
    engine = DockerEngine(
        address=EngineAddress.from_environment(ssh_host.environment), labels={LABEL_TAG: worker_tag()}
    )
    engine.verified_images.add((profile.name, image_id))
    settings = Settings(max_sessions=2, default_timeout=20, max_timeout=60)
    manager = SessionManager(engine, profile, settings)
    store = SnapshotStore(engine, settings, profile.name, tmp_path)
    try:
        session = await manager.create()
        await write_files(manager, session.id, [("data/hi.js", "console.log(6 * 7)")], overwrite=False)
        info, _content = await snapshots.take(manager, store, session.id, "over-ssh")
        assert (info.files, store.kept()[0].name) == (1, "over-ssh")
        restored, _content = await snapshots.restore(manager, store, "over-ssh")
        result = await run_entrypoint(manager, restored.id, "data/hi.js", [], timeout_seconds=20)
        assert (result.stdout, result.exit_code) == ("42\n", 0)
    finally:
        await manager.shutdown()
        for kept in store.kept():
            store.remove(kept)
        engine.close()


@pytest_docker
def test_an_ssh_host_whose_key_is_not_known_is_unavailable_with_a_hint(
    ssh_host: SshEngineHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", ssh_host.environment["HOME"])
    (Path(ssh_host.environment["HOME"]) / ".ssh" / "known_hosts").write_text("")
    error = _unreachable(ssh_host.environment)
    assert (error.code, error.message) == (
        ErrorCode.CONTAINER_UNAVAILABLE,
        "the ssh connection to the Docker engine's host failed",
    )
    assert error.hint is not None and "known_hosts" in error.hint


@pytest_docker
def test_doctor_names_an_engine_reached_over_ssh(ssh_host: SshEngineHost) -> None:
    rows = _doctor_rows(ssh_host.environment)
    assert re.match(rf"PASS Docker Engine \S+ at ssh://127\.0\.0\.1:{ssh_host.port} \(DOCKER_HOST\)", rows["docker"]), (
        rows
    )
    assert rows["tls"].startswith("PASS not needed: ssh"), rows


@pytest_docker
def test_reap_shows_no_escape_sequence_another_server_put_in_its_labels(
    remote: SecondEngine, profile: Profile, image_id: str, tmp_path: Path
) -> None:
    engine = remote.tls_engine(labels={LABEL_TAG: worker_tag()})
    hostile = "\x1b]52;c;cHduZWQ=\x07"  # an OSC 52 clipboard write
    labels = {LABEL_MANAGED: "true", LABEL_SESSION: hostile, LABEL_PROFILE: hostile, LABEL_OWNER: hostile,
              LABEL_HOST: hostile, LABEL_EXPIRES_AT: str(int(time.time()) + 600)}  # fmt: skip
    request = ContainerRequest(image_id, [*profile.helper_argv("watchdog"), "60"], labels, False)
    container_id = engine.create_container(request)
    try:
        environment = engine_command_env(remote.tls_environment) | {"XDG_STATE_HOME": str(tmp_path)}
        result = subprocess.run([CLI, "reap", "--dry-run"], env=environment, capture_output=True, text=True,
                                timeout=120, check=False)  # fmt: skip
    finally:
        engine.remove_container(container_id)
        engine.close()
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if "kept" in line)
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert row.split()[:2] == ["52ccHduZWQ", "52ccHduZWQ"]  # what is left: letters and digits


# -- the engine's clock --------------------------------------------------------------------------------------------


@pytest_docker
@pytest.mark.anyio
async def test_expiry_is_written_and_judged_in_the_engines_time_so_servers_whose_clocks_differ_agree(
    engine: DockerEngine, profile: Profile, image_id: str
) -> None:
    shift = [-3600.0]
    behind = DockerEngine(labels=engine.labels, wall_clock=lambda: time.time() + shift[0])
    ahead = DockerEngine(labels=engine.labels, wall_clock=lambda: time.time() + 7200)
    behind.verified_images.add((profile.name, image_id))
    settings = Settings(max_sessions=1, default_timeout=10, max_timeout=60, max_lifetime=600)
    manager = SessionManager(behind, profile, settings)
    try:
        session = await manager.create()
        facts = engine.container_facts(session.container_id)
        assert facts is not None
        expires_at = int(facts.labels[LABEL_EXPIRES_AT])
        # A lifetime (and a margin) from the engine's now, not from the server's clock an hour behind.
        assert time.time() + 600 < expires_at < time.time() + 600 + 300
        shift[0] = -7200.0  # this machine's clock is stepped back later: the engine's time goes on regardless
        assert abs(behind.now() - time.time()) < 30
        verdicts = survey_managed(ahead, max_lifetime=600, tag=worker_tag())
        mine = [v for v in verdicts if v.container.id == session.container_id]
        assert [(v.remove, v.reason) for v in mine] == [(False, "live")]  # two hours ahead, still not expired
    finally:
        await manager.shutdown()
        behind.close()
        ahead.close()


# -- a lost connection ---------------------------------------------------------------------------------------------


@pytest.fixture
async def through_proxy(
    remote: SecondEngine, profile: Profile, image_id: str
) -> AsyncIterator[tuple[Proxy, SessionManager]]:
    with Proxy(remote.port) as proxy:
        environment = {**remote.tls_environment, "DOCKER_HOST": f"tcp://127.0.0.1:{proxy.port}"}
        engine = DockerEngine(address=EngineAddress.from_environment(environment), labels={LABEL_TAG: worker_tag()})
        engine.verified_images.add((profile.name, image_id))
        manager = SessionManager(engine, profile, Settings(max_sessions=2, default_timeout=20, max_timeout=60))
        try:
            yield proxy, manager
        finally:
            proxy.mend()
            await manager.shutdown()
            engine.close()


@pytest_docker
@pytest.mark.anyio
async def test_a_connection_lost_mid_run_fails_closed_and_the_sandbox_is_removed_once_the_engine_is_back(
    through_proxy: tuple[Proxy, SessionManager], remote: SecondEngine
) -> None:
    proxy, manager = through_proxy
    idle = await manager.create()
    doomed = await manager.create()

    async def cut() -> None:
        proxy.cut()

    errors, seconds = await errors_of_a_run_broken_by(manager, doomed.id, cut)
    assert seconds < 20
    assert [error.code for error in errors] == [ErrorCode.CONTAINER_UNAVAILABLE]
    with pytest.raises(SandboxError) as caught:
        await write_files(manager, doomed.id, [("more.js", "1")], overwrite=False)
    assert caught.value.code == ErrorCode.INVALID_SESSION  # fail-closed: never usable again
    # Both containers' lifelines went with the connection: on the engine's side, they end themselves.
    with anyio.fail_after(20):
        while any(remote.engine.container_facts(s.container_id) for s in (idle, doomed)):  # noqa: ASYNC110
            await anyio.sleep(0.1)
    # Not forgotten: the server cannot confirm the removal while it is cut off.
    assert await manager.reap_once() == 0  # still cut off: the removal waits
    proxy.mend()
    assert await manager.reap_once() == 1
    # The idle session's helper channel went with the connection, and its container: its next call fails closed.
    with pytest.raises(SandboxError) as caught:
        await write_files(manager, idle.id, [("ok.js", "console.log('fine')")], overwrite=False)
    assert caught.value.code in (ErrorCode.TRANSFER_FAILED, ErrorCode.CONTAINER_UNAVAILABLE)
    assert len(manager) == 0
    # And the engine serves new sandboxes as before.
    fresh = await manager.create()
    await write_files(manager, fresh.id, [("ok.js", "console.log('fine')")], overwrite=False)
    assert (await run_entrypoint(manager, fresh.id, "ok.js", [], timeout_seconds=10)).stdout == "fine\n"


# -- several servers on one engine ---------------------------------------------------------------------------------


@pytest_docker
@pytest.mark.anyio
async def test_servers_on_two_machines_sharing_an_engine_keep_their_sessions_through_a_third_servers_start_and_reap(
    remote: SecondEngine, tmp_path: Path
) -> None:
    def machine(name: str) -> dict[str, str]:
        """A server's environment as on a machine of its own: its own state directory, the engine over TLS."""
        environment = engine_command_env(remote.tls_environment, audit_enabled="false", max_sessions="1")
        return environment | {"XDG_STATE_HOME": str(tmp_path / name)}

    async def check_alive(client: ClientSession, session_id: str) -> None:
        files = [{"path": "ping.js", "content": "console.log('pong')"}]
        ok(await client.call_tool("write_files", {"session_id": session_id, "files": files, "overwrite": True}))
        run = ok(await client.call_tool("run_javascript", {"session_id": session_id, "entrypoint": "ping.js"}))
        assert run["stdout"] == "pong\n"

    first = StdioServerParameters(command=CLI, args=["serve"], env=machine("first"))
    second = StdioServerParameters(command=CLI, args=["serve"], env=machine("second"))
    async with (
        stdio_client(first) as (read_a, write_a), ClientSession(read_a, write_a) as client_a,
        stdio_client(second) as (read_b, write_b), ClientSession(read_b, write_b) as client_b,
    ):  # fmt: skip
        await client_a.initialize()
        await client_b.initialize()
        session_a = ok(await client_a.call_tool("create_sandbox", {}))["session_id"]
        session_b = ok(await client_b.call_tool("create_sandbox", {}))["session_id"]
        # Each counts its own sessions against its cap of one, not the other's.
        assert len(worker_containers(remote.engine)) >= 2
        third = StdioServerParameters(command=CLI, args=["serve"], env=machine("third"))
        async with stdio_client(third) as (read_c, write_c), ClientSession(read_c, write_c) as client_c:
            await client_c.initialize()  # its start-up sweep has run by the time it answers a tool call
            assert "session_id" in ok(await client_c.call_tool("create_sandbox", {}))
        with anyio.fail_after(120):
            reap = await anyio.run_process([CLI, "reap"], check=False, env=machine("third"))
        assert reap.returncode == 0, reap.stderr
        table = reap.stdout.decode()
        kept = [row for row in table.splitlines() if row.rstrip().endswith("kept (live)")]
        assert len(kept) >= 2, table  # both live sessions: another machine's server is unknown, never dead
        # Whose is whose: each row names its server (owner token @ machine); the two servers are two owners.
        servers = {re.search(r"\s([0-9a-f]{8}@[A-Za-z0-9.-]+)\s+\?\s+kept", row) for row in kept}
        assert None not in servers and len({match.group(1) for match in servers if match}) >= 2, table
        await check_alive(client_a, session_a)
        await check_alive(client_b, session_b)
    assert worker_containers(remote.engine) == []
