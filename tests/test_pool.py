"""The warm pool: containers started ahead of demand, each handed out at most once, never outliving its promise; under
each container runtime (under gVisor its sandboxes' runs are jailed: ``code_sandbox.channel.jailed``)."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable, Iterator
from pathlib import Path

import anyio
import pytest
from code_sandbox.channel.protocol import ReadyAnswer, SnapshotFile
from code_sandbox.channel.transport import HelperExecs, Target, runtime_argv
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.engine import Engine
from code_sandbox.hardening import (
    LABEL_EXPIRES_AT,
    LABEL_MANAGED,
    PROBE_UID,
    ContainerRequest,
    user_of,
)
from code_sandbox.profile import Profile
from code_sandbox.sandbox import pool as pool_module
from code_sandbox.sandbox import snapshots
from code_sandbox.sandbox.execution import run_entrypoint
from code_sandbox.sandbox.pool import CLAIM_SIGNAL, POOL_MARGIN_SECONDS
from code_sandbox.sandbox.sessions import SessionManager
from code_sandbox.sandbox.snapshot_content import Content
from code_sandbox.sandbox.snapshot_store import SnapshotStore
from code_sandbox.sandbox.workspace import write_files
from code_sandbox.settings import Settings

from tests.conftest import TEST_LABEL
from tests.support.clock import FakeClock
from tests.support.forwarding_engine import ForwardingEngine
from tests.support.pool import running_pool
from tests.support.run import worker_tag
from tests.support.runtimes import TEST_RUNTIMES, runtime_engine

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]
SETTINGS = Settings(max_sessions=3, warm_pool=1)
USABLE_SECONDS = SETTINGS.max_lifetime - POOL_MARGIN_SECONDS
"""How long after it is ready a warm container may be handed out."""


@pytest.fixture(scope="session", params=TEST_RUNTIMES)
def engine(request: pytest.FixtureRequest) -> Iterator[DockerEngine]:
    """The pool works under each container runtime: the host's kernel (runc) and gVisor's (runsc)."""
    yield from runtime_engine(request.param, worker_tag())


@pytest.fixture
async def pooled_manager(engine: DockerEngine, profile: Profile, image_id: str) -> AsyncGenerator[SessionManager]:
    async with running_pool(SessionManager(engine, profile, SETTINGS)) as manager:
        yield manager


async def test_a_warm_container_is_handed_out_once_and_the_pool_refills(
    pooled_manager: SessionManager, engine: DockerEngine
) -> None:
    (warm,) = pooled_manager.pool.warm_containers
    session = await pooled_manager.create()
    assert session.container_id == warm
    # The claim reached a watchdog that was ready for it: the container serves the session.
    await write_files(pooled_manager, session.id, [("a.js", "console.log(1)")], overwrite=False)
    assert (await run_entrypoint(pooled_manager, session.id, "a.js", [], timeout_seconds=5)).stdout == "1\n"
    with anyio.fail_after(30):
        await pooled_manager.pool.wait_for_pool()
    (refill,) = pooled_manager.pool.warm_containers
    assert refill != warm
    second = await pooled_manager.create()
    assert second.container_id == refill
    assert await pooled_manager.destroy(session.id) is True
    assert engine.container_facts(warm) is None
    with anyio.fail_after(30):
        await pooled_manager.pool.wait_for_pool()
    assert warm not in pooled_manager.pool.warm_containers  # never reused


def _watchdog_container(engine: DockerEngine, profile: Profile, image_id: str, *lifetimes: int) -> str:
    request = ContainerRequest(
        image_id=image_id,
        command=runtime_argv(engine, profile, [*profile.helper_argv("watchdog"), *map(str, lifetimes)]),
        labels={LABEL_MANAGED: "true", TEST_LABEL: "1", LABEL_EXPIRES_AT: str(int(time.time()) + sum(lifetimes))},
        apparmor=engine.daemon_facts().apparmor,
    )
    return engine.create_container(request)


def _wait_until_ready(engine: DockerEngine, profile: Profile, container: str) -> None:
    """Poll until the container's watchdog can take its claim signal (as the pool does before handing it out)."""
    gvisor = engine.runtime_in_force().user_space_kernel
    transport = HelperExecs(engine, profile, readable_runtime=gvisor)
    target = Target(container, user_of(PROBE_UID))
    bound = time.monotonic() + 10
    while True:
        answer = transport.watchdog_ready(target, timeout=5)
        assert isinstance(answer, ReadyAnswer), answer
        if answer.ready:
            return
        assert time.monotonic() < bound, "the watchdog never got ready"
        time.sleep(0.02)


def _wait_until_stopped(engine: DockerEngine, container: str, bound: float) -> float:
    """Poll until the container no longer runs; returns when (monotonic) that was seen. Fails after ``bound``."""
    while (facts := engine.container_facts(container)) is not None and facts.state == "running":
        assert time.monotonic() < bound, "a watchdog container outlived its lifetime"
        time.sleep(0.1)
    return time.monotonic()


def test_an_unclaimed_warm_container_dies_by_itself_and_a_claim_gives_a_full_lifetime_from_then(
    engine: DockerEngine, profile: Profile, image_id: str
) -> None:
    # The watchdog's own timer is the subject: real time, with lifetimes as short as the checks can tell apart.
    pool_seconds, session_seconds, second_claim_after = 3, 6, 4
    unclaimed = _watchdog_container(engine, profile, image_id, pool_seconds, session_seconds)
    unclaimed_started = time.monotonic()
    claimed = _watchdog_container(engine, profile, image_id, pool_seconds, session_seconds)
    _wait_until_ready(engine, profile, claimed)
    engine.signal_container(claimed, CLAIM_SIGNAL)
    claimed_at = time.monotonic()
    _wait_until_stopped(engine, unclaimed, unclaimed_started + pool_seconds + 4)
    facts = engine.container_facts(claimed)
    assert facts is not None and facts.state == "running"  # past the pool lifetime: the claim extended it
    # A later claim changes nothing: had it restarted the lifetime, the container would live past the bound below.
    time.sleep(max(0.0, claimed_at + second_claim_after - time.monotonic()))
    engine.signal_container(claimed, CLAIM_SIGNAL)
    stopped_at = _wait_until_stopped(engine, claimed, claimed_at + session_seconds + 3)
    assert stopped_at - claimed_at >= session_seconds - 0.5  # and it had its full session lifetime from the claim


class _CountedSignals(ForwardingEngine):
    """The test's engine, noting every signal sent to a container."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.signals: list[tuple[str, str]] = []

    def signal_container(self, container_id: str, signal: str) -> None:
        self.signals.append((container_id, signal))
        self.inner.signal_container(container_id, signal)


async def test_a_one_shot_takes_a_warm_container_unclaimed_when_its_own_lifetime_covers_the_run(
    engine: DockerEngine, profile: Profile, image_id: str
) -> None:
    """A one-shot is needed for its run only: a warm container with that long left is used as it is, without the claim
    signal's round trip; one with less left is claimed, as for any session."""
    del image_id
    counted = _CountedSignals(engine)
    clock = FakeClock()
    manager = SessionManager(counted, profile, SETTINGS, clock=clock)
    async with running_pool(manager):
        (warm,) = manager.pool.warm_containers
        session = await manager.create(needed_seconds=USABLE_SECONDS)
        assert session.container_id == warm and counted.signals == []
        assert session.deadline == USABLE_SECONDS  # its own end, not a session's lifetime from now
        await write_files(manager, session.id, [("a.js", "console.log(1)")], overwrite=False)
        assert (await run_entrypoint(manager, session.id, "a.js", [], timeout_seconds=5)).stdout == "1\n"
        with anyio.fail_after(30):
            await manager.pool.wait_for_pool()
        (refill,) = manager.pool.warm_containers
        clock.advance(1)  # the refill was made at 0: it has USABLE_SECONDS - 1 left, less than needed
        claimed = await manager.create(needed_seconds=USABLE_SECONDS)
        assert claimed.container_id == refill and counted.signals == [(refill, CLAIM_SIGNAL)]
        assert claimed.deadline == 1 + SETTINGS.max_lifetime


class _CountedCreates(ForwardingEngine):
    """The test's engine, counting the containers it is asked to create."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.creates = 0

    def create_container(
        self, request: ContainerRequest, *, start: bool = True, before_start: Callable[[str], None] | None = None
    ) -> str:
        self.creates += 1
        return self.inner.create_container(request, start=start, before_start=before_start)


async def test_a_refill_waits_while_refills_are_held_and_no_longer_than_the_bound(
    engine: DockerEngine, profile: Profile, image_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore fills the container it claimed while the pool holds back its replacement, whose start would share
    the CPU with it; the replacement starts once the hold ends, or after :data:`HOLD_SECONDS` whatever holds it."""
    del image_id
    counted = _CountedCreates(engine)
    manager = SessionManager(counted, profile, SETTINGS)
    async with running_pool(manager):
        first_fill = counted.creates
        async with manager.pool.refills_held():
            held = await manager.create()
            await anyio.sleep(1.0)  # unheld, the refill starts at once (the first test sees it within 30 s)
            assert counted.creates == first_fill and manager.pool.warm_containers == ()
        with anyio.fail_after(30):
            await manager.pool.wait_for_pool()
        assert counted.creates == first_fill + 1
        monkeypatch.setattr(pool_module, "HOLD_SECONDS", 1.0)
        async with manager.pool.refills_held():
            kept_long = await manager.create()
            with anyio.fail_after(30):
                await manager.pool.wait_for_pool()  # within the hold: it waited 1 s, then refilled
            assert counted.creates == first_fill + 2
        for session in (held, kept_long):
            assert await manager.destroy(session.id) is True


class _SlowSnapshotRead(_CountedCreates):
    """Counts creates, and reads a snapshot slowly: it notes how many creates there had been by its last piece."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.creates_by_last_piece: int | None = None

    def read_snapshot(self, snapshot_id: str, *, max_bytes: int) -> Iterator[bytes]:
        pieces = list(self.inner.read_snapshot(snapshot_id, max_bytes=max_bytes))
        yield from pieces[:-1]
        time.sleep(1.0)  # unheld, a refill starts within this
        self.creates_by_last_piece = self.creates
        yield pieces[-1]


@pytest.mark.usefixtures("snapshots_removed")
async def test_a_restore_fills_the_container_it_claimed_before_the_pool_starts_the_next(
    engine: DockerEngine, profile: Profile, image_id: str, tmp_path: Path
) -> None:
    del image_id
    slow = _SlowSnapshotRead(engine)
    manager = SessionManager(slow, profile, SETTINGS)
    store = SnapshotStore(slow, Settings(), profile.name, tmp_path)
    content = Content((SnapshotFile(type="file", path="a.txt", mode=0o600, size=5),), b"hello")
    store.save("held", content)
    async with running_pool(manager):
        (warm,) = manager.pool.warm_containers
        first_fill = slow.creates
        session, _ = await snapshots.restore(manager, store, "held")
        assert session.container_id == warm
        assert slow.creates_by_last_piece == first_fill  # no refill began while its content streamed
        with anyio.fail_after(30):
            await manager.pool.wait_for_pool()  # and one began after
        assert await manager.destroy(session.id) is True
