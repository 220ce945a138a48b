"""The warm pool: containers started ahead of demand, each handed out at most once, refilled in the background."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

import anyio

from code_sandbox.channel.transport import Target
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import user_of
from code_sandbox.sandbox.provisioner import Provisioned, Provisioner, run_sync
from code_sandbox.timeline import milestone

logger = logging.getLogger(__name__)

CLAIM_SIGNAL = "SIGUSR2"
"""Tells a warm container's watchdog that it now serves a session (see the profile's watchdog helper)."""
POOL_MARGIN_SECONDS = 10
"""A warm container is not handed out this close to the end of its unclaimed lifetime."""
POOL_RETRY_SECONDS = 5.0
HOLD_SECONDS = 10.0
"""How long a refill waits for :meth:`WarmPool.refills_held` at most."""
CLAIM_WAIT_SECONDS = 2.0
"""How long a create waits for the first warm container of a server just started before it starts one of its own."""


@dataclass(frozen=True)
class _Pooled:
    """A warm container, started and unclaimed."""

    made: Provisioned
    usable_until: float  # monotonic; after it the container is about to die by itself


class WarmPool:
    """Keeps ``warm_pool`` started containers of one server process ready to be claimed."""

    def __init__(self, provisioner: Provisioner, clock: Callable[[], float]) -> None:
        self.provisioner = provisioner
        self.clock = clock
        """Seconds on a monotonic clock; a warm container's deadline is measured with it."""
        self._pool: list[_Pooled] = []
        self._warming: set[str] = set()  # created for the pool, not yet ready
        self._getting_ready = 0  # containers being created or readied for the pool, the ones without an ID too
        self._pool_changed = anyio.Event()
        self._closing = False
        self._none_kept = False
        """Set when the runtime allows no warm pool (gVisor): nothing will fill it."""
        self._first_fill = True  # until the first warm container is ready (or failed to get ready)
        self._waiting = 0
        self._holds = 0
        self._released = anyio.Event()

    async def wait_for_first_fill(self, wait: float = CLAIM_WAIT_SECONDS) -> None:
        """In a server just started, wait up to ``wait`` seconds for the first warm container to be ready, if it is
        being made and no other caller is waiting for it already: taking it then is cheaper than starting another
        beside it, both competing for the CPU with the server's own start-up. Later, a refill has just begun when a
        claim finds the pool empty, and a container of the caller's own is ready sooner."""
        if self._pool or not self._first_fill or self._getting_ready <= self._waiting:
            return
        self._waiting += 1
        try:
            with anyio.move_on_after(wait):
                while not self._pool and self._first_fill and self._getting_ready and not self._closing:  # noqa: ASYNC110 - no event says "ready or failed"
                    await anyio.sleep(0.01)
        finally:
            self._waiting -= 1

    async def claim(self, needed_seconds: float | None = None) -> Provisioned | None:
        """Hand out a warm container, at most once: its watchdog switches to the session's lifetime from now.

        With ``needed_seconds`` (a one-shot's whole life, bounded by its run's timeout), a container that has that long
        left as it is gets no claim signal: it keeps its own, earlier end (``Provisioned.ends_by``), and the call is
        spared the signal's round trip through the engine.
        """
        while self._pool:
            pooled = self._pool.pop(0)
            self._pool_changed.set()
            container_id = pooled.made.container_id
            if self.clock() >= pooled.usable_until:
                await self.provisioner.discard(container_id)
                continue
            if needed_seconds is not None and pooled.usable_until - self.clock() >= needed_seconds:
                return pooled.made._replace(ends_by=pooled.usable_until)
            try:
                await run_sync(self.provisioner.engine.signal_container, container_id, CLAIM_SIGNAL)
            except SandboxError:
                await self.provisioner.discard(container_id)
                continue
            return pooled.made
        return None

    @contextlib.asynccontextmanager
    async def refills_held(self) -> AsyncGenerator[None]:
        """Hold back refills while the block runs (at most :data:`HOLD_SECONDS`): a call that moves a workspace into
        the container it just claimed would otherwise share the CPU with the start of the one replacing it."""
        self._holds += 1
        try:
            yield None
        finally:
            self._holds -= 1
            if not self._holds:
                self._released.set()
                self._released = anyio.Event()

    async def _refills_released(self) -> None:
        with anyio.move_on_after(HOLD_SECONDS):
            while self._holds and not self._closing:
                await self._released.wait()

    async def run(self, retry_seconds: float = POOL_RETRY_SECONDS) -> None:
        """Keep ``warm_pool`` started containers ready, refilling in the background; never blocks a call.

        Woken by every change to the pool, and at least every ``retry_seconds`` to retry a failed refill and to
        replace warm containers that are about to go stale.
        """
        target = self.provisioner.settings.warm_pool
        if target == 0:
            return
        if await self._no_pool():
            self._none_kept = True
            self._pool_changed.set()  # wakes wait_for_pool
            return
        pool_seconds = self.provisioner.settings.max_lifetime
        while True:
            now = self.clock()
            for stale in [p for p in self._pool if now >= p.usable_until]:
                self._pool.remove(stale)
                await self.provisioner.discard(stale.made.container_id)
            try:
                while len(self._pool) + len(self._warming) < target and not self._closing:
                    await self._refills_released()
                    await self._add_warm_container(pool_seconds)
            except SandboxError as error:
                logger.warning("the warm pool could not be refilled (%s); retrying", error.for_operator())
            self._pool_changed = anyio.Event()
            with anyio.move_on_after(retry_seconds):
                await self._pool_changed.wait()

    async def _no_pool(self) -> bool:
        """No warm pool under gVisor's engine-only model (:meth:`Transport.supports_warm_pool`)."""
        try:
            possible = await run_sync(self.provisioner.transport.supports_warm_pool)
        except SandboxError:
            return False  # the engine cannot say yet: refills fail and are retried as any would be
        if not possible:
            logger.info("no warm pool under gVisor's engine-only model: new sandboxes start on demand")
        return not possible

    async def _add_warm_container(self, pool_seconds: int) -> None:
        self._getting_ready += 1
        try:
            await self._make_warm_container(pool_seconds)
        finally:
            self._getting_ready -= 1
            self._first_fill = False

    async def _make_warm_container(self, pool_seconds: int) -> None:
        # Known from the moment it exists, so that a shutdown drains it even while it is still getting ready.
        made = Provisioned("", 0)
        with anyio.CancelScope(shield=True):
            made = await self.provisioner.create_container("pool", pool_seconds=pool_seconds)
            self._warming.add(made.container_id)
        container_id, uid = made.container_id, made.uid
        try:
            ready = await self.provisioner.watchdog_ready(container_id, uid)
            if ready and not self._closing:
                # The channels open now, so that the session that claims this container does not wait for them.
                # Still "warming" meanwhile: a shutdown now must find it and remove it.
                try:
                    await run_sync(self.provisioner.transport.prepare, Target(container_id, user_of(uid)))
                except SandboxError:
                    ready = False
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.provisioner.discard(container_id)
            raise
        finally:
            self._warming.discard(container_id)
        if not ready or self._closing:
            with anyio.CancelScope(shield=True):
                await self.provisioner.discard(container_id)
            if not self._closing:  # else it failed because the shutdown removed it: nothing to report
                raise SandboxError(ErrorCode.CONTAINER_START_FAILED, "a warm container did not get ready")
            return
        self._pool.append(_Pooled(made, self.clock() + pool_seconds - POOL_MARGIN_SECONDS))
        self._pool_changed.set()
        milestone("first warm container ready (channels open)")

    @property
    def warm_containers(self) -> tuple[str, ...]:
        """The container IDs waiting in the warm pool (core-internal, like every container ID)."""
        return tuple(pooled.made.container_id for pooled in self._pool)

    async def wait_for_pool(self) -> None:
        """Wait until the warm pool is full (benchmarks and tests use it to measure a warm hand-out); at once where
        none is kept (under gVisor)."""
        while len(self._pool) < self.provisioner.settings.warm_pool and not self._none_kept:
            await self._pool_changed.wait()

    def close(self) -> list[str]:
        """Stop refilling (what is being created now is discarded once ready) and hand over :meth:`drain`'s list."""
        self._closing = True
        return self.drain()

    def drain(self) -> list[str]:
        """Empty the pool; returns its containers and those still warming, for the caller to remove."""
        pooled, self._pool = [entry.made.container_id for entry in self._pool], []
        return [*pooled, *self._warming]
