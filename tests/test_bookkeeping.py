"""The session registry, leases, the warm pool, sweeps, the reaper and their errors, on the in-memory engine and
transport: no Docker engine, milliseconds a test. What these do to real containers is tested in test_sessions.py,
test_pool.py and the conformance suite."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from code_sandbox.engine import ContainerFacts, DaemonFacts
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import LABEL_EXPIRES_AT, LABEL_MANAGED, LABEL_SESSION
from code_sandbox.profile import Profile
from code_sandbox.sandbox.pool import POOL_MARGIN_SECONDS
from code_sandbox.sandbox.provisioner import require_enforcement
from code_sandbox.sandbox.sessions import Session, SessionManager, session_hash
from code_sandbox.sandbox.sweep import judge_container, sweep_managed
from code_sandbox.settings import Settings

from tests.support.clock import FakeClock
from tests.support.memory_engine import MemoryEngine
from tests.support.memory_transport import MemoryTransport
from tests.support.pool import running_pool

pytestmark = pytest.mark.anyio
SETTINGS = Settings(max_lifetime=60, idle_timeout=30, max_sessions=2, default_timeout=5, max_timeout=20)
POOLED = Settings(max_sessions=3, warm_pool=1)
USABLE_SECONDS = POOLED.max_lifetime - POOL_MARGIN_SECONDS
"""How long after it is ready a warm container may be handed out."""


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def engine(profile: Profile) -> MemoryEngine:
    engine = MemoryEngine()
    engine.add_image(profile)
    return engine


def make_manager(
    engine: MemoryEngine, profile: Profile, clock: FakeClock, settings: Settings = SETTINGS
) -> SessionManager:
    return SessionManager(engine, profile, settings, clock=clock, transport=MemoryTransport())


@pytest.fixture
async def manager(engine: MemoryEngine, profile: Profile, clock: FakeClock) -> AsyncIterator[SessionManager]:
    manager = make_manager(engine, profile, clock)
    yield manager
    await manager.shutdown()


def live(engine: MemoryEngine) -> set[str]:
    return set(engine.containers)


# -- the registry and its cap ----------------------------------------------------------------------------------


async def test_concurrent_creates_never_pass_the_session_cap(manager: SessionManager) -> None:
    outcomes: list[str] = []

    async def create() -> None:
        try:
            await manager.create()
            outcomes.append("created")
        except SandboxError as error:
            outcomes.append(error.code)

    async with anyio.create_task_group() as group:
        for _ in range(6):
            group.start_soon(create)
    assert sorted(outcomes) == ["SESSION_LIMIT_EXCEEDED"] * 4 + ["created"] * 2
    assert len(manager) == 2


async def test_session_cap_is_enforced_and_destroy_is_idempotent(manager: SessionManager, engine: MemoryEngine) -> None:
    first = await manager.create()
    await manager.create()
    with pytest.raises(SandboxError) as caught:
        await manager.create()
    assert caught.value.code == ErrorCode.SESSION_LIMIT_EXCEEDED
    assert await manager.destroy(first.id) is True
    assert first.container_id not in live(engine)
    assert await manager.destroy(first.id) is False
    assert await manager.destroy("never-existed") is False
    await manager.create()  # the slot is free again


async def test_a_manager_that_shut_down_starts_no_more_sandboxes(manager: SessionManager) -> None:
    await manager.shutdown()
    with pytest.raises(SandboxError) as caught:
        await manager.create()
    assert caught.value.code == ErrorCode.CONTAINER_UNAVAILABLE and len(manager) == 0


async def test_shutdown_removes_every_session(manager: SessionManager, engine: MemoryEngine) -> None:
    sessions = [await manager.create(), await manager.create()]
    await manager.shutdown()
    assert len(manager) == 0
    assert not live(engine) and set(engine.removed) == {s.container_id for s in sessions}


async def test_an_engine_that_cannot_list_or_start_fails_the_create_and_leaves_nothing(
    manager: SessionManager, engine: MemoryEngine
) -> None:
    engine.fail("list_containers", SandboxError(ErrorCode.CONTAINER_UNAVAILABLE, "the engine is away"))
    with pytest.raises(SandboxError) as listing:
        await manager.create()
    engine.fail("start", SandboxError(ErrorCode.CONTAINER_START_FAILED, "no start"))
    with pytest.raises(SandboxError) as starting:
        await manager.create()
    assert (listing.value.code, starting.value.code) == (
        ErrorCode.CONTAINER_UNAVAILABLE,
        ErrorCode.CONTAINER_START_FAILED,
    )
    assert len(manager) == 0 and not live(engine) and len(engine.removed) == 2


# -- creation in progress ---------------------------------------------------------------------------------------


async def _entered(engine: MemoryEngine, call: str = "create_container") -> None:
    with anyio.fail_after(10):
        while not engine.entered[call].is_set():  # type: ignore[index]  # noqa: ASYNC110 - set by a worker thread
            await anyio.sleep(0.01)


async def test_a_session_being_created_holds_its_slot_and_nothing_else_touches_it(
    manager: SessionManager, engine: MemoryEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    go = engine.hold("create_container")

    def the_known_id(nbytes: int | None = None) -> str:  # a client learns it only when the create returns
        del nbytes
        return "being-created"

    monkeypatch.setattr(secrets, "token_urlsafe", the_known_id)
    created: list[Session] = []

    async def create() -> None:
        created.append(await manager.create())

    async with anyio.create_task_group() as group:
        group.start_soon(create)
        try:
            await _entered(engine)
            assert len(manager) == 1  # counted against the cap
            # Its deadline is 0, so to the reaper it looks expired; it has no container that anything could remove.
            assert await manager.reap_once() == 0
            assert await manager.destroy("being-created") is False
            assert manager.retire("being-created") is None
            with pytest.raises(SandboxError) as caught:
                async with manager.lease("being-created"):
                    pass
            assert caught.value.code == ErrorCode.INVALID_SESSION
            assert len(manager) == 1 and engine.removed == []
        finally:
            go.set()
    (session,) = created
    assert (session.id, session.state, len(manager)) == ("being-created", "active", 1)
    assert live(engine) == {session.container_id}


@pytest.mark.parametrize("how", ["cancelled", "failed"])
async def test_a_create_that_is_cancelled_or_fails_leaves_neither_a_placeholder_nor_a_container(
    manager: SessionManager, engine: MemoryEngine, how: str
) -> None:
    go = engine.hold("create_container")
    if how == "failed":
        engine.fail("create_container", SandboxError(ErrorCode.CONTAINER_START_FAILED, "x"))
    refused: list[str] = []

    async def create() -> None:
        try:
            await manager.create()
        except SandboxError as error:
            refused.append(error.code)

    async with anyio.create_task_group() as group:
        group.start_soon(create)
        try:
            await _entered(engine)
            assert len(manager) == 1
            if how == "cancelled":
                group.cancel_scope.cancel()  # lands while the container is being made: it is made, then removed
        finally:
            go.set()
    with anyio.fail_after(10):  # the worker thread finishes the create after the cancel, then the container goes
        while live(engine):  # noqa: ASYNC110
            await anyio.sleep(0.01)
    assert refused == ([ErrorCode.CONTAINER_START_FAILED] if how == "failed" else [])
    assert len(manager) == 0


# -- leases, expiry and the reaper ------------------------------------------------------------------------------


async def test_an_idle_session_expires_and_its_container_goes(
    manager: SessionManager, engine: MemoryEngine, clock: FakeClock
) -> None:
    session = await manager.create()
    clock.advance(SETTINGS.idle_timeout - 1)
    async with manager.lease(session.id):  # not idle long enough yet; this use starts the idle time again
        pass
    clock.advance(SETTINGS.idle_timeout)  # idle since that use, still inside the lifetime
    assert clock.now < session.deadline
    with pytest.raises(SandboxError) as caught:
        async with manager.lease(session.id):
            pass
    assert caught.value.code == ErrorCode.SESSION_EXPIRED
    assert session.container_id not in live(engine)
    with pytest.raises(SandboxError) as again:
        async with manager.lease(session.id):
            pass
    assert again.value.code == ErrorCode.INVALID_SESSION


async def test_a_session_in_constant_use_still_expires_at_its_lifetime(
    manager: SessionManager, engine: MemoryEngine, clock: FakeClock
) -> None:
    session = await manager.create()
    for _ in range(3):
        async with manager.lease(session.id):
            pass
        clock.advance(SETTINGS.max_lifetime / 3)  # never idle as long as the idle timeout
    with pytest.raises(SandboxError) as caught:
        async with manager.lease(session.id):
            pass
    assert caught.value.code == ErrorCode.SESSION_EXPIRED
    assert session.container_id not in live(engine)


async def test_the_reaper_removes_expired_sessions(
    manager: SessionManager, engine: MemoryEngine, clock: FakeClock
) -> None:
    session = await manager.create()
    clock.advance(SETTINGS.idle_timeout - 1)
    assert await manager.reap_once() == 0
    assert session.container_id in live(engine)
    clock.advance(1)
    assert await manager.reap_once() == 1
    assert len(manager) == 0 and session.container_id not in live(engine)


async def test_a_failed_removal_is_kept_and_retried_by_destroy_and_by_the_reaper(
    manager: SessionManager, engine: MemoryEngine
) -> None:
    session = await manager.create()
    engine.fail("remove_container", SandboxError(ErrorCode.CONTAINER_REMOVAL_FAILED, "injected"), times=2)
    with pytest.raises(SandboxError) as caught:
        await manager.destroy(session.id)
    assert caught.value.code == ErrorCode.CONTAINER_REMOVAL_FAILED
    assert len(manager) == 1  # not forgotten
    with pytest.raises(SandboxError) as refused:
        async with manager.lease(session.id):
            pass
    assert refused.value.code == ErrorCode.INVALID_SESSION  # disabled while destroying
    assert await manager.reap_once() == 0  # the reaper retried and failed again
    assert engine.calls.count("remove_container") == 2 and len(manager) == 1
    assert session.container_id in live(engine)
    assert await manager.destroy(session.id) is False  # a second destroy retries and now succeeds
    assert engine.calls.count("remove_container") == 3 and len(manager) == 0
    assert session.container_id not in live(engine)


@pytest.mark.parametrize("how", ["fail_closed", "fail_closed_with"])
async def test_a_cancel_landing_while_a_session_fails_closed_still_destroys_it(
    manager: SessionManager, engine: MemoryEngine, how: str
) -> None:
    session = await manager.create()
    with anyio.CancelScope() as scope:
        scope.cancel()  # already cancelled: every unshielded await in there would stop at once
        if how == "fail_closed":
            await manager.fail_closed(session)
        else:
            await manager.fail_closed_with(session, SandboxError(ErrorCode.SUPERVISOR_FAILED, "x"))
    assert len(manager) == 0 and session.state != "active"
    assert session.container_id not in live(engine)


async def test_a_reaper_pass_while_a_session_fails_closed_does_not_change_the_reported_code(
    manager: SessionManager, engine: MemoryEngine
) -> None:
    # fail_closed_with watches the container for a moment to tell "it vanished" from "we destroy it"; a reaper
    # pass meanwhile must leave the session to it, or the call would report CONTAINER_UNAVAILABLE.
    session = await manager.create()
    error = SandboxError(ErrorCode.INTERNAL_ERROR, "not reached")
    async with anyio.create_task_group() as group:
        group.start_soon(manager.run_reaper, 0.01)
        error = await manager.fail_closed_with(session, SandboxError(ErrorCode.SUPERVISOR_FAILED, "x"))
        group.cancel_scope.cancel()
    assert error.code == ErrorCode.SUPERVISOR_FAILED
    assert len(manager) == 0 and session.container_id not in live(engine)


async def test_a_container_that_vanished_under_a_failing_session_is_reported_unavailable(
    manager: SessionManager, engine: MemoryEngine
) -> None:
    session = await manager.create()
    engine.containers.pop(session.container_id)  # its watchdog ended it, or someone removed it
    error = await manager.fail_closed_with(session, SandboxError(ErrorCode.SUPERVISOR_FAILED, "x"))
    assert error.code == ErrorCode.CONTAINER_UNAVAILABLE and len(manager) == 0


# -- the warm pool ----------------------------------------------------------------------------------------------


async def _filled(manager: SessionManager) -> None:
    with anyio.fail_after(10):
        await manager.pool.wait_for_pool()


async def test_a_warm_container_near_the_end_of_its_pool_lifetime_is_discarded_not_handed_out(
    engine: MemoryEngine, profile: Profile, clock: FakeClock
) -> None:
    # The filler never wakes by itself here: only a claim looks at the warm container's age.
    async with running_pool(make_manager(engine, profile, clock, POOLED), retry_seconds=3600) as manager:
        (warm,) = manager.pool.warm_containers
        clock.advance(USABLE_SECONDS - 1)
        assert (await manager.create()).container_id == warm  # a second before the margin: still handed out
        await _filled(manager)
        (stale,) = manager.pool.warm_containers
        clock.advance(USABLE_SECONDS)
        session = await manager.create()
        assert session.container_id != stale
        assert stale not in live(engine)  # removed, not left to die by itself


async def test_the_pool_replaces_a_warm_container_that_can_no_longer_be_handed_out(
    engine: MemoryEngine, profile: Profile, clock: FakeClock
) -> None:
    async with running_pool(make_manager(engine, profile, clock, POOLED), retry_seconds=0.01) as manager:
        (stale,) = manager.pool.warm_containers
        clock.advance(USABLE_SECONDS)
        with anyio.fail_after(10):
            while manager.pool.warm_containers in ((), (stale,)):  # noqa: ASYNC110
                await anyio.sleep(0.01)
        assert stale not in live(engine)


async def test_shutdown_drains_the_pool(engine: MemoryEngine, profile: Profile, clock: FakeClock) -> None:
    async with running_pool(make_manager(engine, profile, clock, POOLED)) as manager:
        (warm,) = manager.pool.warm_containers
        await manager.shutdown()
        assert warm not in live(engine) and not live(engine) and manager.pool.warm_containers == ()


async def test_a_create_while_the_first_warm_container_gets_ready_waits_for_it_rather_than_starting_another(
    engine: MemoryEngine, profile: Profile, clock: FakeClock
) -> None:
    go = engine.hold("start")
    async with running_pool(make_manager(engine, profile, clock, POOLED), filled=False) as manager:
        try:
            await _entered(engine, "start")
            (warming,) = live(engine)
            assert not manager.pool.warm_containers  # started, not ready yet: the state a server just started is in
            created: list[Session] = []

            async def create() -> None:
                created.append(await manager.create())

            with anyio.fail_after(10):
                async with anyio.create_task_group() as group:
                    group.start_soon(create)
                    await anyio.sleep(0.05)
                    go.set()
            assert created[0].container_id == warming and engine.calls.count("create_container") <= 2
        finally:
            go.set()


async def test_once_the_pool_was_filled_a_create_during_a_refill_starts_its_own_container(
    engine: MemoryEngine, profile: Profile, clock: FakeClock
) -> None:
    async with running_pool(make_manager(engine, profile, clock, POOLED)) as manager:
        (warm,) = manager.pool.warm_containers
        go = engine.hold("start")  # the refill stays in the making
        try:
            first = await manager.create()
            await _entered(engine, "start")
            created: list[Session] = []

            async def second_create() -> None:
                created.append(await manager.create())

            with anyio.fail_after(10):
                async with anyio.create_task_group() as group:
                    group.start_soon(second_create)
                    await anyio.sleep(0.05)
                    go.set()
        finally:
            go.set()
        assert first.container_id == warm
        labels = engine.containers[created[0].container_id].labels
        assert labels[LABEL_SESSION] == session_hash(created[0].id)  # not a pool container


def test_an_engine_without_seccomp_or_linux_containers_is_refused() -> None:
    for facts in (
        DaemonFacts(architecture="x86_64", os_type="linux", apparmor=False, seccomp=False),
        DaemonFacts(architecture="x86_64", os_type="windows", apparmor=False, seccomp=True),
    ):
        # A daemon cannot be switched to these modes on demand, so the rule is checked on the facts it reports.
        with pytest.raises(SandboxError) as caught:
            require_enforcement(facts)
        assert caught.value.code == ErrorCode.CONTAINER_UNAVAILABLE
    require_enforcement(DaemonFacts(architecture="x86_64", os_type="linux", apparmor=False, seccomp=True))


def test_sweep_keeps_an_unlabelled_container_whose_creation_time_is_unknown() -> None:
    # Docker always reports a creation time, so this branch is judged on facts it could not produce.
    facts = ContainerFacts(id="x", labels={LABEL_MANAGED: "true"}, state="running", created=None)
    verdict = judge_container(facts, max_lifetime=30, now=time.time())
    assert verdict.remove is False


# -- sweeps -----------------------------------------------------------------------------------------------------


def _managed(
    engine: MemoryEngine, labels: dict[str, str], *, state: str = "running", created: float | None = None
) -> str:
    return engine.add_container({LABEL_MANAGED: "true", **labels}, state=state, created=created)


def _in_an_hour() -> str:
    return str(int(time.time()) + 3600)


def test_sweep_removes_a_stopped_managed_container(engine: MemoryEngine, tmp_path: Path) -> None:
    stopped = _managed(engine, {LABEL_EXPIRES_AT: _in_an_hour()}, state="exited")
    sweep_managed(engine, max_lifetime=600, state_dir=tmp_path)
    assert engine.removed == [stopped]


def test_sweep_keeps_a_container_that_another_server_is_still_creating(engine: MemoryEngine, tmp_path: Path) -> None:
    _managed(engine, {LABEL_EXPIRES_AT: _in_an_hour()}, state="created")
    sweep_managed(engine, max_lifetime=600, state_dir=tmp_path)
    assert engine.removed == []


def test_sweep_removes_an_expired_running_container_and_keeps_an_unexpired_one(
    engine: MemoryEngine, tmp_path: Path
) -> None:
    expired = _managed(engine, {LABEL_EXPIRES_AT: str(int(time.time()) - 1)})
    _managed(engine, {LABEL_EXPIRES_AT: _in_an_hour()})
    sweep_managed(engine, max_lifetime=600, state_dir=tmp_path)
    assert engine.removed == [expired]


def test_sweep_judges_an_unlabelled_container_by_its_age(engine: MemoryEngine, tmp_path: Path) -> None:
    old = _managed(engine, {LABEL_EXPIRES_AT: "soon"}, created=time.time() - 700)
    _managed(engine, {}, created=time.time() - 60)
    sweep_managed(engine, max_lifetime=600, state_dir=tmp_path)
    assert engine.removed == [old]


def test_sweep_judges_only_its_tag_and_counts_the_removals_that_failed(engine: MemoryEngine, tmp_path: Path) -> None:
    expired = str(int(time.time()) - 1)
    ours = _managed(engine, {LABEL_EXPIRES_AT: expired, "io.code-sandbox.tag": "mine"})
    _managed(engine, {LABEL_EXPIRES_AT: expired, "io.code-sandbox.tag": "theirs"})
    engine.fail("remove_container", SandboxError(ErrorCode.CONTAINER_REMOVAL_FAILED, "injected"))
    verdicts, failures = sweep_managed(engine, max_lifetime=600, state_dir=tmp_path, tag="mine")
    assert ([v.container.id for v in verdicts], failures, engine.removed) == ([ours], 1, [])
    assert sweep_managed(engine, max_lifetime=600, state_dir=tmp_path, tag="mine")[1] == 0
    assert engine.removed == [ours]
