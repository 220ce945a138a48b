"""The session registry: creation, leases, expiry, the reaper, removal retries and shutdown.

A session is one hardened container, known to clients only by a random token. The container ID stays in here
and in the engine. A session is forgotten only once Docker confirms its container is gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

import anyio
import anyio.lowlevel

from code_sandbox.channel.guard import Channel
from code_sandbox.channel.observed import RuntimeTransport
from code_sandbox.channel.transport import Target, Transport
from code_sandbox.engine import Engine
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import user_of
from code_sandbox.image import VerifiedImages
from code_sandbox.profile import Profile
from code_sandbox.sandbox.pool import WarmPool
from code_sandbox.sandbox.provisioner import Provisioned, Provisioner, run_sync
from code_sandbox.settings import Settings

logger = logging.getLogger(__name__)

REAPER_INTERVAL_SECONDS = 2.0
SHUTDOWN_SECONDS = 8.0
LOST_CONTAINER_GRACE_SECONDS = 1.0
HELPERS_IDLE_SECONDS = 30.0
"""A session unused this long lets go of what its sandbox holds between calls (``Transport.rest``): the channel, the
next run's process and the supervisor's exec, about three idle runtimes; the watchdog alone is left. The next call
opens them again, which costs it one exec."""
REMOVAL_WAIT_SECONDS = 10.0
"""How long a create at the cap waits for sandboxes already on their way out (:meth:`SessionManager.stop`)."""
STOP_SIGNAL = "SIGTERM"
"""What ends a sandbox without waiting: the watchdog exits on it, the container stops, and Docker removes it."""


def session_hash(session_id: str) -> str:
    """A stable, non-reversible name for a session in logs, labels and the audit log."""
    return hashlib.sha256(session_id.encode()).hexdigest()[:16]


@dataclass
class Session:
    """One live sandbox. ``container_id`` never leaves core."""

    id: str
    container_id: str
    expires_at: float  # epoch seconds, the host-side hard deadline
    deadline: float  # the same instant on the monotonic clock
    last_used: float  # monotonic
    uid: int = 0  # the sandbox's own uid: user code and its helpers run as it
    packages: tuple[str, ...] = ()  # what its image vendors (name@version)
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    state: Literal["creating", "active", "failing", "destroying"] = "active"
    """``creating``: a placeholder that holds a slot under the cap while its container is made; it has none yet,
    and only the create that reserved it takes it out (the session that replaces it is ``active``);
    ``failing``: untrusted and being destroyed by the call that found out (the reaper leaves it to that call);
    ``destroying``: removal started, or failed and is retried by the reaper."""
    removing: bool = False
    """Whether a removal of its container is under way now."""
    rested: bool = False
    """Whether its helpers were let go of since its last call (:data:`HELPERS_IDLE_SECONDS`)."""

    @property
    def hash(self) -> str:
        return session_hash(self.id)

    @property
    def user(self) -> str:
        """The ``uid:gid`` that every exec touching user content runs as."""
        return user_of(self.uid)

    @property
    def provisioned(self) -> bool:
        """Whether the session has a container, which removal may take: every state but ``creating``."""
        return self.state != "creating"


class SessionManager:
    """Owns every session of this server process; makes their containers with a :class:`Provisioner`, or takes
    them from a :class:`WarmPool`."""

    def __init__(
        self,
        engine: Engine,
        profile: Profile,
        settings: Settings,
        *,
        owner: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        transport: Transport | None = None,
        verified: VerifiedImages | None = None,
    ) -> None:
        self.provisioner = Provisioner(
            engine,
            profile,
            settings,
            owner=owner or secrets.token_hex(8),
            transport=transport or RuntimeTransport(engine, profile),
            verified=verified,
        )
        """Makes the containers; it holds what they are made with (engine, profile, settings, owner, transport)."""
        self.clock = clock
        """Seconds on a monotonic clock; idle timeouts, lifetimes and the pool's deadlines are measured with it."""
        self.pool = WarmPool(self.provisioner, lambda: self.clock())  # the manager's clock, even once replaced
        self._sessions: dict[str, Session] = {}
        self._closing = False
        self._removed = anyio.Event()
        """Set (and replaced) whenever a removal ends: a create at the cap waits on it."""

    # -- lookup -------------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._sessions)

    def _find(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise SandboxError(
                ErrorCode.INVALID_SESSION, "no such sandbox; it was destroyed, expired, or never existed"
            )
        if session.state != "active":  # a placeholder still "creating" is never leased either
            raise SandboxError(ErrorCode.INVALID_SESSION, "this sandbox has been destroyed")
        return session

    def _expired(self, session: Session, now: float) -> bool:
        return now >= session.deadline or now - session.last_used >= self.provisioner.settings.idle_timeout

    @contextlib.asynccontextmanager
    async def lease(self, session_id: str) -> AsyncGenerator[Session]:
        """Hold a session exclusively for one operation; expired sessions are destroyed and refused."""
        session = self._find(session_id)
        async with session.lock:
            session = self._find(session_id)  # it may have been destroyed while we waited
            if self._expired(session, self.clock()):
                await self._destroy_quietly(session)
                raise SandboxError(ErrorCode.SESSION_EXPIRED, "this sandbox expired and has been destroyed")
            session.last_used = self.clock()
            session.rested = False
            try:
                yield session
            finally:
                session.last_used = self.clock()

    @contextlib.asynccontextmanager
    async def channel(self, session_id: str) -> AsyncGenerator[Channel]:
        """Lease a session (:meth:`lease`) and hand out its helpers, with this manager's fail-closed rule."""
        async with self.lease(session_id) as session:
            yield Channel(
                self.provisioner.transport,
                Target(session.container_id, session.user),
                partial(self.fail_closed_with, session),
                seconds_left=session.deadline - self.clock(),
                name=session.hash,
                container_gone=partial(self._container_gone, session.container_id),
            )

    def _container_gone(self, container_id: str) -> bool:
        """Whether the engine says the container is gone or has stopped; ``False`` when it does not answer (the
        call's own deadline still holds)."""
        try:
            facts = self.provisioner.engine.container_facts(container_id)
        except SandboxError:
            return False
        return facts is None or facts.state in ("exited", "dead", "removing")

    # -- create -------------------------------------------------------------------------------------------------

    async def create(self, *, needed_seconds: float | None = None) -> Session:
        """Start a new sandbox container from the verified image (or claim a warm one).

        :param needed_seconds: how long the session is needed at most (a one-shot's): a warm container with that long
            left is handed out without a claim, its lifetime its own (:meth:`WarmPool.claim`).
        """
        if self._closing:
            raise _shutting_down()
        await self._wait_for_removals()
        if len(self._sessions) >= self.provisioner.settings.max_sessions:
            raise SandboxError(
                ErrorCode.SESSION_LIMIT_EXCEEDED,
                f"at most {self.provisioner.settings.max_sessions} sandboxes may exist at once; destroy one first",
            )
        session_id = secrets.token_urlsafe(32)
        # Reserve the slot before the first await, so concurrent creates cannot pass the cap together.
        self._sessions[session_id] = Session(session_id, "", 0.0, 0.0, self.clock(), state="creating")
        lifetime = self.provisioner.settings.max_lifetime
        try:
            await self.pool.wait_for_first_fill()  # cancellable: nothing is held yet but the placeholder
            # Shielded: a cancellation must not lose the ID of a container that was created (or claimed) anyway.
            made, claimed = Provisioned("", 0), None
            with anyio.CancelScope(shield=True):
                claimed = await self.pool.claim(needed_seconds)
                made = claimed or await self.provisioner.create_container(session_hash(session_id))
        except BaseException:
            self._sessions.pop(session_id, None)
            raise
        now_wall, now = time.time(), self.clock()
        container_id, uid = made.container_id, made.uid
        if made.ends_by is not None:
            lifetime = made.ends_by - now
        session = Session(session_id, container_id, now_wall + lifetime, now + lifetime, now, uid, made.packages)
        self._sessions[session_id] = session
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
            if self._closing:  # shutdown began while the container was made: it took its list without this one
                raise _shutting_down()
        except (anyio.get_cancelled_exc_class(), SandboxError):
            with anyio.CancelScope(shield=True):
                await self._destroy_quietly(session)
            raise
        if claimed is None:  # a warm container's channels are open already
            self.provisioner.prepare_soon(container_id, uid)
        logger.info("session %s created", session.hash)
        return session

    async def _wait_for_removals(self) -> None:
        """At the cap, wait (bounded) while sandboxes that were destroyed are still being removed: a client that
        destroys one and creates another at once must not meet the cap of the one it gave back."""
        with anyio.move_on_after(REMOVAL_WAIT_SECONDS):
            while len(self._sessions) >= self.provisioner.settings.max_sessions and any(
                session.removing for session in self._sessions.values()
            ):
                await self._removed.wait()

    # -- destroy ------------------------------------------------------------------------------------------------

    async def stop(self, session_id: str) -> Session | None:
        """The first half of ``destroy_sandbox``, all a client waits for: take a live session out of use (its calls
        get ``INVALID_SESSION`` from now on) and tell its watchdog to exit (:data:`STOP_SIGNAL`, one engine call
        that does not wait for the container). The container then stops and Docker removes it by itself, so
        nothing is left behind even if this process dies next.

        Returns the session, whose removal the caller confirms with :meth:`remove_quietly` (it counts against the
        cap until then), or ``None`` when there was no live session. When the signal cannot be sent, the container
        is removed here instead, as :meth:`destroy` does (raising ``CONTAINER_REMOVAL_FAILED`` if that fails), and
        ``session`` is returned with nothing left to remove.
        """
        session = self._sessions.get(session_id)
        if session is None or session.state != "active":
            return None
        session.state = "destroying"
        try:
            await run_sync(self.provisioner.engine.signal_container, session.container_id, STOP_SIGNAL)
        except SandboxError:  # gone already, or the engine did not take the signal: remove it now
            await self._remove(session)
        return session

    async def destroy(self, session_id: str) -> bool:
        """Remove a session's container. Idempotent: ``False`` when there was no such live session.

        A failed removal keeps the session (state ``destroying``) so that the reaper and later calls retry it.
        """
        session = self._sessions.get(session_id)
        if session is None or not session.provisioned:
            return False
        was_live = session.state == "active"
        await self._remove(session)
        return was_live

    def retire(self, session_id: str) -> Session | None:
        """Take a live session out of use at once (its calls get ``INVALID_SESSION`` from now on); it still counts
        against the cap until :meth:`remove_quietly` (or the reaper, on a failure) has removed its container."""
        session = self._sessions.get(session_id)
        if session is None or not session.provisioned:
            return None
        session.state = "destroying"
        return session

    async def remove_quietly(self, session: Session) -> None:
        """Remove a retired session's container; a failure leaves it to the reaper's retries."""
        with anyio.CancelScope(shield=True):
            await self._destroy_quietly(session)

    async def _remove(self, session: Session, *, abandon: bool = False) -> None:
        if not session.provisioned:
            return  # a placeholder has no container to remove; the create that reserved it takes it out
        if session.id not in self._sessions:
            return  # removed already (a stopped session whose removal was confirmed by another caller)
        session.state = "destroying"
        session.removing = True
        try:
            await run_sync(self.provisioner.engine.remove_container, session.container_id, abandon=abandon)
        except SandboxError as error:
            logger.warning("session %s: container removal failed (%s); will retry", session.hash, error.for_operator())
            raise SandboxError(
                ErrorCode.CONTAINER_REMOVAL_FAILED,
                "the sandbox could not be removed yet; it is disabled and removal will be retried",
            ) from None
        finally:
            session.removing = False
            self._removed.set()
            self._removed = anyio.Event()
        self.provisioner.transport.close(session.container_id)
        self._sessions.pop(session.id, None)
        logger.info("session %s destroyed", session.hash)

    async def _destroy_quietly(self, session: Session, *, abandon: bool = False) -> None:
        with contextlib.suppress(SandboxError):
            await self._remove(session, abandon=abandon)

    async def fail_closed(self, session: Session) -> None:
        """Destroy a session whose state can no longer be trusted (a broken transfer, an integrity violation).

        The session is unusable from the first line on, and a cancellation cannot stop its removal: a call
        cancelled at this point must not leave an untrusted sandbox active.
        """
        session.state = "failing"
        with anyio.CancelScope(shield=True):
            await self._destroy_quietly(session)

    async def fail_closed_with(self, session: Session, error: SandboxError) -> SandboxError:
        """Destroy an untrustworthy session (as :meth:`fail_closed`) and say why: ``error``, or
        ``CONTAINER_UNAVAILABLE`` when the container itself vanished (removed outside code-sandbox, or the daemon
        went away)."""
        session.state = "failing"
        lost = False
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(LOST_CONTAINER_GRACE_SECONDS):
                # A container killed under us can still say "running" for a moment; watch it briefly.
                while not lost:
                    try:
                        facts = await run_sync(self.provisioner.engine.container_facts, session.container_id)
                        lost = facts is None or facts.state != "running"
                    except SandboxError:
                        lost = True
                    if not lost:
                        await anyio.sleep(0.1)
            await self._destroy_quietly(session)
        if lost:
            return SandboxError(
                ErrorCode.CONTAINER_UNAVAILABLE,
                "the sandbox's container is gone (removed outside code-sandbox, or Docker stopped responding); "
                "the sandbox was discarded",
            )
        return error

    # -- background work ----------------------------------------------------------------------------------------

    async def reap_once(self) -> int:
        """Destroy expired and idle sessions and retry failed removals. Returns how many were removed."""
        now = self.clock()
        removed = 0
        for session in list(self._sessions.values()):
            if not session.provisioned or session.removing:
                continue  # still being created, or being removed by another caller
            if session.state == "destroying" or (self._expired(session, now) and not session.lock.locked()):
                with contextlib.suppress(SandboxError):
                    await self._remove(session)
                    removed += 1
            elif self._resting(session, now):
                await self._rest(session)
        return removed

    def _resting(self, session: Session, now: float) -> bool:
        """Whether an active session has been idle long enough to let go of its helpers, and has not yet."""
        idle = now - session.last_used >= HELPERS_IDLE_SECONDS
        return session.state == "active" and idle and not session.rested

    async def _rest(self, session: Session) -> None:
        """Let go of an idle session's helpers, holding its lease so that no call starts meanwhile."""
        if session.lock.locked():
            return  # a call is under way: it is not idle
        async with session.lock:
            if not self._resting(session, self.clock()):
                return
            session.rested = True
            target = Target(session.container_id, session.user)
            await run_sync(self.provisioner.transport.rest, target)
            logger.info("session %s idle: its helpers were let go of until its next call", session.hash)

    async def run_reaper(self, interval: float = REAPER_INTERVAL_SECONDS) -> None:
        while True:
            await anyio.sleep(interval)
            try:
                await self.reap_once()
            except Exception:  # the reaper must survive anything, e.g. the daemon going away
                logger.warning("the session reaper failed a pass; it will try again")

    async def shutdown(self) -> None:
        """Remove every session and warm container of this server, bounded in time."""
        self._closing = True  # creates from now on are refused
        with anyio.move_on_after(SHUTDOWN_SECONDS, shield=True):
            async with anyio.create_task_group() as group:
                # The pool filler stops, and discards what it was creating.
                for container_id in [*self.pool.close(), *self.provisioner.starting]:
                    group.start_soon(self.provisioner.discard, container_id)
                for session in list(self._sessions.values()):
                    if session.provisioned:
                        # Abandonable: a hung daemon must not hold shutdown past its bound; what is left is
                        # removed by the interpreter-exit handler or, at worst, by the container's watchdog.
                        group.start_soon(partial(self._destroy_quietly, session, abandon=True))
        self.provisioner.transport.close_all()

    def remove_all_now(self) -> None:
        """Synchronous last resort for interpreter exit: remove what is left, ignoring failures."""
        for container_id in [*self.pool.drain(), *self.provisioner.starting]:
            with contextlib.suppress(Exception):
                self.provisioner.engine.remove_container(container_id)
        for session in list(self._sessions.values()):
            if session.provisioned:
                with contextlib.suppress(Exception):
                    self.provisioner.engine.remove_container(session.container_id)
                    self._sessions.pop(session.id, None)


def _shutting_down() -> SandboxError:
    return SandboxError(ErrorCode.CONTAINER_UNAVAILABLE, "the server is shutting down; no new sandbox is started")
