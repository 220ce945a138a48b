"""The session engine against a real Docker engine: hardening, lifecycle, expiry, retries, sweep and reap."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.engine import ExecRequest
from code_sandbox.hardening import (
    LABEL_EXPIRES_AT,
    LABEL_MANAGED,
    LABEL_TAG,
    LABEL_UID,
    SANDBOX_UIDS,
    ContainerRequest,
)
from code_sandbox.image import VerifiedImages, verify_image
from code_sandbox.profile import Profile
from code_sandbox.sandbox import provisioner
from code_sandbox.sandbox.evaluation import evaluate_code
from code_sandbox.sandbox.execution import run_entrypoint
from code_sandbox.sandbox.sessions import HELPERS_IDLE_SECONDS, Session, SessionManager
from code_sandbox.sandbox.sweep import sweep_managed
from code_sandbox.sandbox.workspace import write_files
from code_sandbox.seccomp import profile_text
from code_sandbox.settings import Settings
from code_sandbox_cli.main import app
from typer.testing import CliRunner

from tests.conftest import TEST_LABEL, WORKER_TAG
from tests.security.conftest import sandbox_processes
from tests.support.clock import FakeClock
from tests.support.images import start_container
from tests.support.inspect import inspect_container
from tests.support.run import command_env, worker_containers

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]
MiB = 1024 * 1024


@pytest.fixture
def settings() -> Settings:
    return Settings(max_lifetime=60, idle_timeout=30, max_sessions=2, default_timeout=5, max_timeout=20)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def manager(
    engine: DockerEngine, profile: Profile, settings: Settings, clock: FakeClock, image_id: str
) -> AsyncIterator[SessionManager]:
    # On the fake clock no session expires unless a test says so, however slow the engine is.
    del image_id
    manager = SessionManager(engine, profile, settings, clock=clock)
    yield manager
    await manager.shutdown()


def _node(engine: DockerEngine, session: Session, script: str, timeout: float = 30) -> bytes:
    argv = ["/usr/local/bin/node", "-e", script]
    result = engine.exec(session.container_id, ExecRequest(argv, user=session.user, timeout=timeout, max_stdout=MiB))
    assert result.exit_code == 0, result.stderr
    return result.stdout


async def test_container_settings_match_the_hardening_snapshot(
    manager: SessionManager, engine: DockerEngine, image_id: str
) -> None:
    session = await manager.create()
    inspect = inspect_container(engine, session.container_id)
    host: dict[str, Any] = inspect["HostConfig"]
    uid = session.uid
    assert uid in SANDBOX_UIDS and inspect["Config"]["Labels"][LABEL_UID] == str(uid)
    config: dict[str, Any] = inspect["Config"]
    apparmor = engine.daemon_facts().apparmor
    expected_host: dict[str, object] = {
        "NetworkMode": "none",
        "ReadonlyRootfs": True,
        "CapDrop": ["ALL"],
        "Privileged": False,
        # Our own seccomp profile (AF_UNIX sockets only, among others); AppArmor only where the engine enforces it.
        "SecurityOpt": [
            "no-new-privileges:true",
            f"seccomp={profile_text(engine.daemon_facts().architecture)}",
            *(["apparmor=docker-default"] if apparmor else []),
        ],
        "Memory": 512 * MiB,
        "MemorySwap": 512 * MiB,
        "NanoCpus": 1_000_000_000,
        "PidsLimit": 128,
        "Init": True,
        "Ulimits": [{"Name": "core", "Hard": 0, "Soft": 0}, {"Name": "nofile", "Hard": 1024, "Soft": 1024}],
        "Tmpfs": {
            "/workspace": f"rw,noexec,nosuid,nodev,size={64 * MiB},nr_inodes=8192,mode=0700,uid={uid},gid={uid}",
            "/tmp": f"rw,noexec,nosuid,nodev,size={64 * MiB},nr_inodes=8192,mode=0700,uid={uid},gid={uid}",
            "/dev/pts": "ro,noexec,nosuid,nodev,size=4096,mode=0755",  # no devpts: ptys are a host-wide pool
            "/dev/mqueue": "ro,noexec,nosuid,nodev,size=4096,mode=0755",  # no mqueue filesystem
            "/usr/local/gvisor": "ro,noexec,nosuid,nodev,size=4096,mode=0755",  # no readable binary: gVisor's alone
        },
        "LogConfig": {"Type": "none", "Config": {}},
        "AutoRemove": True,
        "PidMode": "",
        "IpcMode": "none",
        "UTSMode": "",
        "UsernsMode": "",
        "CgroupnsMode": "private",
        "Runtime": "runc",  # the engine's default runtime: CODE_SANDBOX_RUNTIME is unset
    }
    for key, value in expected_host.items():
        assert host.get(key) == value, key
    # Daemons report "none" as null or as an empty list/map depending on their version; both mean none.
    empty = ("PortBindings", "Dns", "DnsOptions", "DnsSearch", "ExtraHosts", "Binds", "Mounts", "VolumesFrom",
             "Devices", "DeviceRequests", "DeviceCgroupRules", "GroupAdd", "CapAdd", "Links", "Sysctls")  # fmt: skip
    for key in empty:
        assert not host.get(key), key
    assert config["Image"] == image_id
    assert config["User"] == "65533:65533"
    assert config["Hostname"] == "sandbox"
    assert config["NetworkDisabled"] is True
    assert not config.get("ExposedPorts")
    assert not config.get("Volumes")
    assert sorted(config["Env"]) == ["HOME=/workspace", "LANG=C.UTF-8", "PATH=/usr/local/bin", "TMPDIR=/tmp"]
    # The entrypoint is ours, so neither the image's entrypoint nor its command applies; no health check runs.
    assert config["Entrypoint"] == ["/usr/local/bin/node"]
    assert config["Cmd"] == ["--disable-sigusr1", "--jitless", "/opt/sandbox/watchdog.mjs", "--lifeline", "62"]
    # Its lifeline: stdin open, attached by the server before the start, closed when that one client goes.
    assert (config["OpenStdin"], config["StdinOnce"], config["AttachStdin"]) == (True, True, True)
    assert config["Healthcheck"] == {"Test": ["NONE"]}
    labels = config["Labels"]
    assert labels["io.code-sandbox.managed"] == "true"
    assert labels["io.code-sandbox.profile"] == "javascript-offline"
    assert labels["io.code-sandbox.owner"] == manager.provisioner.owner
    assert labels["io.code-sandbox.runtime"] == "runc"
    # the lifetime, the watchdog grace and a margin of one engine timeout (the start may lag the label)
    assert abs(int(labels[LABEL_EXPIRES_AT]) - (time.time() + 62 + engine.timeout)) < 5
    assert session.container_id not in session.id and len(session.id) >= 43


async def test_a_drawn_uid_that_another_container_carries_is_detected_and_drawn_again(
    manager: SessionManager, engine: DockerEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken, free = SANDBOX_UIDS[7], SANDBOX_UIDS[8]
    draws = iter([taken, taken, free])
    monkeypatch.setattr(provisioner, "draw_uid", lambda: next(draws))
    first = await manager.create()
    second = await manager.create()
    assert (first.uid, second.uid) == (taken, free)
    holders = [c.id for c in engine.list_containers(f"{LABEL_UID}={taken}")]
    assert holders == [first.container_id]  # the clashing container was removed before it ever started
    assert _node(engine, second, "console.log(process.getuid())") == f"{free}\n".encode()


async def test_a_blocked_call_in_one_session_does_not_delay_another(
    manager: SessionManager, engine: DockerEngine
) -> None:
    busy, other = await manager.create(), await manager.create()

    # Spins (holding its exec call, a worker thread and the lease) until the test drops a file in its /tmp, so it
    # cannot end before the calls on the other session do: they are served while it is blocked, or never.
    spin = (
        "const fs=require('fs');fs.writeFileSync('/tmp/spinning','');"
        "for(;;){const t=Date.now();while(Date.now()-t<50){}if(fs.existsSync('/tmp/stop'))break}"
    )
    long_call_done = anyio.Event()

    async def long_call() -> None:
        async with manager.lease(busy.id) as session:
            await anyio.to_thread.run_sync(_node, engine, session, spin)
        long_call_done.set()

    def spinning() -> bool:
        return _node(engine, busy, "console.log(require('fs').existsSync('/tmp/spinning'))") == b"true\n"

    async with anyio.create_task_group() as group:
        group.start_soon(long_call)
        try:
            with anyio.fail_after(30):
                while not await anyio.to_thread.run_sync(spinning):  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            with anyio.fail_after(20):  # a stalled event loop or a shared lock would hang here until the stop file
                for _ in range(3):
                    async with manager.lease(other.id) as session:
                        assert await anyio.to_thread.run_sync(_node, engine, session, "console.log(1)") == b"1\n"
            assert not long_call_done.is_set()
        finally:
            await anyio.to_thread.run_sync(_node, engine, busy, "require('fs').writeFileSync('/tmp/stop','')")


def _managed_container(engine: DockerEngine, image_id: str, labels: dict[str, str], *, start: bool = True) -> str:
    request = ContainerRequest(
        image_id=image_id,
        command=["/usr/local/bin/node", "/opt/sandbox/watchdog.mjs", "120"],
        labels={LABEL_MANAGED: "true", TEST_LABEL: "1", **labels},
        apparmor=engine.daemon_facts().apparmor,
    )
    return engine.create_container(request, start=start)


def test_sweep_removes_a_stopped_managed_container(engine: DockerEngine, image_id: str) -> None:
    # Created without auto-remove, started with a main process that exits at once: it stays, stopped.
    request = ContainerRequest(
        image_id=image_id,
        command=["/usr/local/bin/node", "-e", "0"],
        labels={LABEL_MANAGED: "true", TEST_LABEL: "1", LABEL_EXPIRES_AT: str(int(time.time()) + 600)},
        apparmor=engine.daemon_facts().apparmor,
    )
    container = engine.create_container(request, start=False)
    # The engine lists its creation time, which the sweep judges an unlabelled container by.
    (listed,) = [c for c in engine.list_containers(LABEL_MANAGED) if c.id == container]
    assert listed.created is not None and abs(listed.created - time.time()) < 60
    start_container(engine, container)
    deadline = time.monotonic() + 20
    while (facts := engine.container_facts(container)) is not None and facts.state == "running":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    sweep_managed(engine, max_lifetime=600, tag=WORKER_TAG)
    assert engine.container_facts(container) is None


def test_sweep_keeps_a_container_that_another_server_is_still_creating(engine: DockerEngine, image_id: str) -> None:
    container = _managed_container(engine, image_id, {LABEL_EXPIRES_AT: str(int(time.time()) + 600)}, start=False)
    sweep_managed(engine, max_lifetime=600, tag=WORKER_TAG)
    assert engine.container_facts(container) is not None


def test_reap_dry_run_changes_nothing_and_reap_removes_only_the_expired_of_its_tag(
    engine: DockerEngine, image_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))  # liveness markers: the test's own, not the user's
    expired = _managed_container(engine, image_id, {LABEL_EXPIRES_AT: str(int(time.time()) - 5)})
    live = _managed_container(engine, image_id, {LABEL_EXPIRES_AT: str(int(time.time()) + 600)})
    other_tag = DockerEngine(labels={LABEL_TAG: WORKER_TAG + "-other"})
    expired_other = _managed_container(other_tag, image_id, {LABEL_EXPIRES_AT: str(int(time.time()) - 5)})
    try:
        runner = CliRunner()
        dry = runner.invoke(app, ["reap", "--dry-run", "--tag", WORKER_TAG])
        assert dry.exit_code == 0, dry.output
        assert "would remove" in dry.output and "2 managed container(s)" in dry.output
        assert all(engine.container_facts(c) is not None for c in (expired, live, expired_other))
        real = runner.invoke(app, ["reap", "--tag", WORKER_TAG])
        assert real.exit_code == 0, real.output
        assert engine.container_facts(expired) is None
        assert engine.container_facts(live) is not None
        assert engine.container_facts(expired_other) is not None  # garbage, but another tag's: not asked for
        assert expired not in real.output and expired[:12] not in real.output
        refused = runner.invoke(app, ["reap", "--tag", "not a tag"])
        assert refused.exit_code == 2 and "--tag must be" in refused.output
    finally:
        other_tag.remove_container(expired_other)
        other_tag.close()


_ORPHAN_SCRIPT = """
import anyio, sys
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.plugins import create_plugin_manager, select_profile
from code_sandbox.sandbox.sessions import SessionManager
from code_sandbox.settings import load_settings

async def main():
    settings = load_settings()
    engine = DockerEngine(labels=settings.container_labels())
    manager = SessionManager(engine, select_profile(create_plugin_manager(), None), settings)
    await manager.create()
    print("ready", flush=True)
    await anyio.sleep(3600)

anyio.run(main)
"""


@pytest.mark.slow  # the watchdog's real timer: 30 s is the shortest lifetime the settings allow
def test_a_killed_server_leaves_a_container_that_removes_itself_within_the_lifetime(
    engine: DockerEngine, image_id: str
) -> None:
    del image_id
    env = command_env(max_lifetime="30", idle_timeout="10", max_timeout="20", default_timeout="5")
    before = {c.id for c in worker_containers(engine)}
    with subprocess.Popen([sys.executable, "-c", _ORPHAN_SCRIPT], stdout=subprocess.PIPE, env=env) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        orphans = {c.id for c in worker_containers(engine)} - before
        assert len(orphans) == 1
        proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    while engine.container_facts(next(iter(orphans))) is not None:
        assert time.monotonic() - killed_at < 35, "the orphaned container outlived its lifetime"
        time.sleep(0.5)


async def test_an_image_verified_by_one_server_is_trusted_by_the_next_through_the_state_directory(
    engine: DockerEngine, profile: Profile, image_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    verifications: list[str] = []

    def counting_verify(engine: DockerEngine, profile: Profile) -> Any:
        verifications.append(profile.name)
        return verify_image(engine, profile)

    monkeypatch.setattr(provisioner, "verify_image", counting_verify)

    async def first_create(directory: Path) -> None:
        # A new engine object per "server process": nothing is remembered in memory from the previous one.
        fresh = DockerEngine(labels=engine.labels)
        manager = SessionManager(fresh, profile, Settings(warm_pool=0), verified=VerifiedImages(directory))
        try:
            await manager.create()
        finally:
            await manager.shutdown()
            fresh.close()

    del image_id
    await first_create(tmp_path / "state")
    await first_create(tmp_path / "state")  # the next server: no export, no probe container
    assert verifications == [profile.name]
    await first_create(tmp_path / "other")  # another state directory knows nothing
    assert len(verifications) == 2
    # Only a regular file this user owns counts: a planted symlink is no pass.
    (key,) = [entry.name for entry in (tmp_path / "other").iterdir()]
    (tmp_path / "state" / key).unlink()
    (tmp_path / "state" / key).symlink_to(tmp_path / "other" / key)
    await first_create(tmp_path / "state")
    assert len(verifications) == 3
    # Nor does a pass in a directory that others may write.
    (tmp_path / "other").chmod(0o770)
    await first_create(tmp_path / "other")
    assert len(verifications) == 4


async def test_a_sandbox_not_from_the_pool_has_its_channel_opened_before_its_first_call(
    manager: SessionManager, engine: DockerEngine
) -> None:
    session = await manager.create()

    def commands() -> list[str]:
        top = engine.client().top(session.container_id)
        return [row[top["Titles"].index("CMD")] for row in top["Processes"]]

    with anyio.fail_after(15):
        while not any(command.endswith("--channel") for command in await anyio.to_thread.run_sync(commands)):  # noqa: ASYNC110
            await anyio.sleep(0.05)
    assert await write_files(manager, session.id, [("a.txt", "x")], overwrite=False) == ["written"]


# -- an idle session's helpers ------------------------------------------------------------------------------------


@pytest.fixture
async def resting_manager(
    engine: DockerEngine, profile: Profile, clock: FakeClock, image_id: str
) -> AsyncIterator[SessionManager]:
    """A manager whose sessions outlive :data:`HELPERS_IDLE_SECONDS` of idleness (on the fake clock)."""
    del image_id
    settings = Settings(max_lifetime=600, idle_timeout=300, max_sessions=2, default_timeout=5, max_timeout=20)
    manager = SessionManager(engine, profile, settings, clock=clock)
    yield manager
    await manager.shutdown()


async def _roles(session: Session, want: set[str]) -> set[str]:
    """The roles of the sandbox's processes once they are ``want`` (or whatever they are after 20 s)."""
    roles: set[str] = set()
    with anyio.move_on_after(20):
        while (roles := {key.split(":")[0] for key in sandbox_processes(session.container_id, session.uid)}) != want:  # noqa: ASYNC110
            await anyio.sleep(0.1)
    return roles


BUSY = {"docker-init", "watchdog", "channel", "supervisor", "next run"}


async def test_an_idle_session_lets_go_of_its_helpers_and_its_next_call_opens_them_again(
    resting_manager: SessionManager, clock: FakeClock
) -> None:
    manager = resting_manager
    session = await manager.create()
    await write_files(manager, session.id, [("index.js", "console.log('hello')")], overwrite=False)
    assert (await run_entrypoint(manager, session.id, "index.js", [], timeout_seconds=10)).stdout == "hello\n"
    assert await _roles(session, BUSY) == BUSY
    clock.advance(HELPERS_IDLE_SECONDS - 1)
    await manager.reap_once()
    assert await _roles(session, BUSY) == BUSY  # not idle long enough yet
    clock.advance(1)
    await manager.reap_once()
    assert await _roles(session, {"docker-init", "watchdog"}) == {"docker-init", "watchdog"}
    # The next call opens what it needs again; the workspace is as it was.
    assert (await run_entrypoint(manager, session.id, "index.js", [], timeout_seconds=10)).stdout == "hello\n"
    assert await _roles(session, BUSY) == BUSY
    assert len(manager) == 1


async def test_a_session_with_an_evaluation_context_keeps_it_while_idle(
    resting_manager: SessionManager, clock: FakeClock
) -> None:
    manager = resting_manager
    session = await manager.create()
    await evaluate_code(manager, session.id, "globalThis.kept = 41", timeout_seconds=5, reset=False)
    clock.advance(HELPERS_IDLE_SECONDS)
    await manager.reap_once()
    result = await evaluate_code(manager, session.id, "kept + 1", timeout_seconds=5, reset=False)
    assert result.value == "42" and not result.context_reset
