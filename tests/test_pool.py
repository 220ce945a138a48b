"""The warm pool: containers started ahead of demand, each handed out at most once, never outliving its promise."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator

import anyio
import pytest
from code_sandbox.engine import DockerEngine
from code_sandbox.execution import run_entrypoint
from code_sandbox.hardening import LABEL_EXPIRES_AT, LABEL_MANAGED, ContainerRequest
from code_sandbox.plugins import Profile
from code_sandbox.sessions import CLAIM_SIGNAL, SessionManager
from code_sandbox.settings import Settings
from code_sandbox.workspace import write_files

from tests.conftest import TEST_LABEL

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]


@pytest.fixture
async def pooled_manager(engine: DockerEngine, profile: Profile, image_id: str) -> AsyncGenerator[SessionManager]:
    del image_id
    manager = SessionManager(engine, profile, Settings(max_sessions=3, warm_pool=1))
    async with anyio.create_task_group() as group:
        group.start_soon(manager.run_pool)
        with anyio.fail_after(30):
            await manager.wait_for_pool()
        yield manager
        group.cancel_scope.cancel()
    await manager.shutdown()


async def test_a_warm_container_is_handed_out_once_and_the_pool_refills(
    pooled_manager: SessionManager, engine: DockerEngine
) -> None:
    (warm,) = pooled_manager.warm_containers
    session = await pooled_manager.create()
    assert session.container_id == warm
    # The claim reached a watchdog that was ready for it: the container serves the session.
    await write_files(pooled_manager, session.id, [("a.js", "console.log(1)")], overwrite=False)
    assert (await run_entrypoint(pooled_manager, session.id, "a.js", [], timeout_seconds=5)).stdout == "1\n"
    with anyio.fail_after(30):
        await pooled_manager.wait_for_pool()
    (refill,) = pooled_manager.warm_containers
    assert refill != warm
    second = await pooled_manager.create()
    assert second.container_id == refill
    assert await pooled_manager.destroy(session.id) is True
    assert engine.container_facts(warm) is None
    with anyio.fail_after(30):
        await pooled_manager.wait_for_pool()
    assert warm not in pooled_manager.warm_containers  # never reused


async def test_shutdown_drains_the_pool(pooled_manager: SessionManager, engine: DockerEngine) -> None:
    (warm,) = pooled_manager.warm_containers
    await pooled_manager.shutdown()
    assert engine.container_facts(warm) is None
    assert pooled_manager.warm_containers == ()


def _watchdog_container(engine: DockerEngine, profile: Profile, image_id: str, *lifetimes: int) -> str:
    request = ContainerRequest(
        image_id=image_id,
        command=[*profile.helper_argv("watchdog"), *map(str, lifetimes)],
        labels={LABEL_MANAGED: "true", TEST_LABEL: "1", LABEL_EXPIRES_AT: str(int(time.time()) + sum(lifetimes))},
        apparmor=engine.daemon_facts().apparmor,
    )
    return engine.create_container(request)


def test_an_unclaimed_warm_container_dies_by_itself_and_a_claim_gives_a_full_lifetime_from_then(
    engine: DockerEngine, profile: Profile, image_id: str
) -> None:
    started = time.monotonic()
    unclaimed = _watchdog_container(engine, profile, image_id, 3, 8)
    claimed = _watchdog_container(engine, profile, image_id, 3, 8)
    time.sleep(2)
    engine.signal_container(claimed, CLAIM_SIGNAL)
    claimed_at = time.monotonic()
    engine.signal_container(claimed, CLAIM_SIGNAL)  # a second claim changes nothing
    while engine.container_facts(unclaimed) is not None:
        assert time.monotonic() - started < 3 + 4, "an unclaimed warm container outlived its pool lifetime"
        time.sleep(0.2)
    facts = engine.container_facts(claimed)
    assert facts is not None and facts.state == "running"  # past the pool lifetime: the claim extended it
    while engine.container_facts(claimed) is not None:
        assert time.monotonic() - claimed_at < 8 + 4, "a claimed container outlived its session lifetime"
        time.sleep(0.2)
    assert time.monotonic() - claimed_at >= 8 - 0.5  # and it had its full session lifetime from the claim
