"""Session lifecycle: the registry, leases, expiry, the reaper, removal retries, the start-up sweep and shutdown.

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
from typing import Literal, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

from code_sandbox.channel import Channel
from code_sandbox.engine import DaemonFacts, DockerEngine
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import (
    LABEL_EXPIRES_AT,
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_PROFILE,
    LABEL_SESSION,
    LABEL_UID,
    SANDBOX_UIDS,
    ContainerRequest,
    user_of,
)
from code_sandbox.image import VerifiedImages, verification_key, verify_image
from code_sandbox.profile import Profile
from code_sandbox.protocol import ReadyAnswer
from code_sandbox.settings import Settings
from code_sandbox.transport import ChannelTransport, Target, Transport

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

WATCHDOG_GRACE_SECONDS = 2
"""The container outlives the host-side deadline by this much, so the host always expires a session first."""
REAPER_INTERVAL_SECONDS = 2.0
SHUTDOWN_SECONDS = 8.0
CLAIM_SIGNAL = "SIGUSR2"
"""Tells a warm container's watchdog that it now serves a session (see the profile's watchdog helper)."""
POOL_MARGIN_SECONDS = 10
"""A warm container is not handed out this close to the end of its unclaimed lifetime."""
POOL_RETRY_SECONDS = 5.0
POOL_READY_SECONDS = 10.0
LOST_CONTAINER_GRACE_SECONDS = 1.0
UID_ATTEMPTS = 5
"""A uid already labelled on another live container is given up and another one drawn, this many times."""


def draw_uid() -> int:
    """A sandbox uid drawn at random from the range; collisions are caught by the label check, not avoided here."""
    return SANDBOX_UIDS[secrets.randbelow(len(SANDBOX_UIDS))]


def session_hash(session_id: str) -> str:
    """A stable, non-reversible name for a session in logs, labels and the audit log."""
    return hashlib.sha256(session_id.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class _Pooled:
    """A warm container, started and unclaimed."""

    container_id: str
    uid: int
    usable_until: float  # monotonic; after it the container is about to die by itself


@dataclass
class Session:
    """One live sandbox. ``container_id`` never leaves core."""

    id: str
    container_id: str
    expires_at: float  # epoch seconds, the host-side hard deadline
    deadline: float  # the same instant on the monotonic clock
    last_used: float  # monotonic
    uid: int = 0  # the sandbox's own uid: user code and its helpers run as it
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    state: Literal["active", "failing", "destroying"] = "active"
    """``failing``: untrusted and being destroyed by the call that found out (the reaper leaves it to that call);
    ``destroying``: removal started, or failed and is retried by the reaper."""

    @property
    def hash(self) -> str:
        return session_hash(self.id)

    @property
    def user(self) -> str:
        """The ``uid:gid`` that every exec touching user content runs as."""
        return user_of(self.uid)


class SessionManager:
    """Owns every session of this server process."""

    def __init__(
        self,
        engine: DockerEngine,
        profile: Profile,
        settings: Settings,
        *,
        owner: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        transport: Transport | None = None,
        verified: VerifiedImages | None = None,
    ) -> None:
        self.engine = engine
        self.transport = transport or ChannelTransport(engine, profile)
        """How calls reach the helpers inside the sandboxes."""
        self.verified = verified
        """Image verifications that earlier server processes recorded (the state directory), if any."""
        self.clock = clock
        """Seconds on a monotonic clock; idle timeouts, lifetimes and the pool's deadlines are measured with it."""
        self.profile = profile
        self.settings = settings
        self.owner = owner or secrets.token_hex(8)
        """This server process (its liveness marker's token, :mod:`code_sandbox.liveness`); labels its containers."""
        self._sessions: dict[str, Session] = {}
        self._image_lock = anyio.Lock()
        self._pool: list[_Pooled] = []
        self._warming: set[str] = set()  # created for the pool, not yet ready
        self._starting: set[str] = set()  # created, not yet handed to a session or the pool (set by a worker thread)
        self._pool_changed = anyio.Event()
        self._closing = False

    # -- lookup -------------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._sessions)

    def _find(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise SandboxError(
                ErrorCode.INVALID_SESSION, "no such sandbox; it was destroyed, expired, or never existed"
            )
        if session.state != "active":
            raise SandboxError(ErrorCode.INVALID_SESSION, "this sandbox has been destroyed")
        return session

    def _expired(self, session: Session, now: float) -> bool:
        return now >= session.deadline or now - session.last_used >= self.settings.idle_timeout

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
            try:
                yield session
            finally:
                session.last_used = self.clock()

    @contextlib.asynccontextmanager
    async def channel(self, session_id: str) -> AsyncGenerator[Channel]:
        """Lease a session (:meth:`lease`) and hand out its helpers, with this manager's fail-closed rule."""
        async with self.lease(session_id) as session:
            yield Channel(
                self.transport,
                Target(session.container_id, session.user),
                partial(self.fail_closed_with, session),
                seconds_left=session.deadline - self.clock(),
                name=session.hash,
            )

    # -- create -------------------------------------------------------------------------------------------------

    async def create(self) -> Session:
        """Start a new sandbox container from the verified image."""
        if len(self._sessions) >= self.settings.max_sessions:
            raise SandboxError(
                ErrorCode.SESSION_LIMIT_EXCEEDED,
                f"at most {self.settings.max_sessions} sandboxes may exist at once; destroy one first",
            )
        session_id = secrets.token_urlsafe(32)
        # Reserve the slot before the first await, so concurrent creates cannot pass the cap together.
        self._sessions[session_id] = Session(session_id, "", 0.0, 0.0, self.clock(), state="destroying")
        lifetime = self.settings.max_lifetime
        try:
            # Shielded: a cancellation must not lose the ID of a container that was created (or claimed) anyway.
            container_id, uid = "", 0
            with anyio.CancelScope(shield=True):
                claimed = await self._claim_pooled() or await self._create_container(session_hash(session_id))
                container_id, uid = claimed
        except BaseException:
            self._sessions.pop(session_id, None)
            raise
        now_wall, now = time.time(), self.clock()
        session = Session(session_id, container_id, now_wall + lifetime, now + lifetime, now, uid)
        self._sessions[session_id] = session
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._destroy_quietly(session)
            raise
        logger.info("session %s created", session.hash)
        return session

    async def _create_container(self, label_session: str, *, pool_seconds: int | None = None) -> tuple[str, int]:
        """Create and start a hardened container whose watchdog enforces the session's hard lifetime.

        With ``pool_seconds`` the container waits in the warm pool: it dies by itself after that long unless a
        claim moves its deadline to a full session lifetime from the moment of the claim. Returns the container
        ID and the sandbox uid it was given.
        """
        image_id = await self._verified_image_id()
        daemon = await self._run(self.engine.daemon_facts)
        require_enforcement(daemon)
        session_seconds = self.settings.max_lifetime + WATCHDOG_GRACE_SECONDS
        watchdog = [*self.profile.helper_argv("watchdog")]
        # The label is written before the create call, and the container may start as late as the engine's
        # timeout after it: the margin keeps another server's sweep from taking a live session for expired.
        latest_end = int(time.time()) + session_seconds + self.engine.timeout
        if pool_seconds is None:
            watchdog.append(str(session_seconds))
        else:
            watchdog += [str(pool_seconds), str(session_seconds)]
            latest_end += pool_seconds  # claimed at the last moment
        for _attempt in range(UID_ATTEMPTS):
            uid = draw_uid()
            request = ContainerRequest(
                image_id=image_id,
                command=watchdog,
                labels={
                    LABEL_MANAGED: "true",
                    LABEL_OWNER: self.owner,
                    LABEL_PROFILE: self.profile.name,
                    LABEL_EXPIRES_AT: str(latest_end),
                    LABEL_SESSION: label_session,
                    LABEL_UID: str(uid),
                },
                apparmor=daemon.apparmor,
                uid=uid,
            )
            try:
                container_id = await self._run(
                    partial(self.engine.create_container, request, before_start=partial(self._before_start, uid))
                )
            except _UidTaken:
                logger.info("a drawn sandbox uid was in use on this engine; drawing another")
                continue
            # Handed over without an await in between: the caller records it as a session's or the pool's.
            self._starting.discard(container_id)
            return container_id, uid
        raise SandboxError(ErrorCode.CONTAINER_START_FAILED, "no free sandbox uid could be found on this engine")

    def _before_start(self, uid: int, container_id: str) -> None:
        """Called between create and start: record the container, so that a shutdown meanwhile removes it, then
        fail if any other container on the engine is labelled with ``uid``.

        Two servers that draw the same uid at once both create before they check, so at least one of them sees
        the other and draws again: a shared uid is detected, never started.
        """
        self._starting.add(container_id)
        holders = self.engine.list_containers(f"{LABEL_UID}={uid}")
        if any(holder.id != container_id for holder in holders):
            self._starting.discard(container_id)  # the engine removes it as the error leaves
            raise _UidTaken

    # -- warm pool ----------------------------------------------------------------------------------------------

    async def _claim_pooled(self) -> tuple[str, int] | None:
        """Hand out a warm container, at most once: its watchdog switches to the session's lifetime from now."""
        while self._pool:
            pooled = self._pool.pop(0)
            self._pool_changed.set()
            if self.clock() >= pooled.usable_until:
                await self._discard(pooled.container_id)
                continue
            try:
                await self._run(self.engine.signal_container, pooled.container_id, CLAIM_SIGNAL)
            except SandboxError:
                await self._discard(pooled.container_id)
                continue
            return pooled.container_id, pooled.uid
        return None

    async def run_pool(self, retry_seconds: float = POOL_RETRY_SECONDS) -> None:
        """Keep ``warm_pool`` started containers ready, refilling in the background; never blocks a call.

        Woken by every change to the pool, and at least every ``retry_seconds`` to retry a failed refill and to
        replace warm containers that are about to go stale.
        """
        target = self.settings.warm_pool
        if target == 0:
            return
        pool_seconds = self.settings.max_lifetime
        while True:
            now = self.clock()
            for stale in [p for p in self._pool if now >= p.usable_until]:
                self._pool.remove(stale)
                await self._discard(stale.container_id)
            try:
                while len(self._pool) + len(self._warming) < target and not self._closing:
                    await self._add_warm_container(pool_seconds)
            except SandboxError as error:
                logger.warning("the warm pool could not be refilled (%s); retrying", error.code)
            self._pool_changed = anyio.Event()
            with anyio.move_on_after(retry_seconds):
                await self._pool_changed.wait()

    async def _add_warm_container(self, pool_seconds: int) -> None:
        # Known from the moment it exists, so that a shutdown drains it even while it is still getting ready.
        container_id, uid = "", 0
        with anyio.CancelScope(shield=True):
            container_id, uid = await self._create_container("pool", pool_seconds=pool_seconds)
            self._warming.add(container_id)
        try:
            ready = await self._watchdog_ready(container_id, uid)
            if ready and not self._closing:
                # The channels open now, so that the session that claims this container does not wait for them.
                # Still "warming" meanwhile: a shutdown now must find it and remove it.
                try:
                    await self._run(self.transport.prepare, Target(container_id, user_of(uid)))
                except SandboxError:
                    ready = False
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._discard(container_id)
            raise
        finally:
            self._warming.discard(container_id)
        if not ready or self._closing:
            with anyio.CancelScope(shield=True):
                await self._discard(container_id)
            if not ready:
                raise SandboxError(ErrorCode.CONTAINER_START_FAILED, "a warm container did not get ready")
            return
        self._pool.append(_Pooled(container_id, uid, self.clock() + pool_seconds - POOL_MARGIN_SECONDS))
        self._pool_changed.set()

    async def _watchdog_ready(self, container_id: str, uid: int) -> bool:
        """Wait until the watchdog can take its claim signal; claimed any sooner, it would die of it."""
        ask = partial(self.transport.watchdog_ready, Target(container_id, user_of(uid)), timeout=5)
        with anyio.move_on_after(POOL_READY_SECONDS):
            while True:
                try:
                    answer = await self._run(ask)
                except SandboxError:
                    return False
                if isinstance(answer, ReadyAnswer) and answer.ready:
                    return True
                await anyio.sleep(0.02)
        return False

    @property
    def warm_containers(self) -> tuple[str, ...]:
        """The container IDs waiting in the warm pool (core-internal, like every container ID)."""
        return tuple(pooled.container_id for pooled in self._pool)

    async def wait_for_pool(self) -> None:
        """Wait until the warm pool is full (benchmarks and tests use it to measure a warm hand-out)."""
        while len(self._pool) < self.settings.warm_pool:
            await self._pool_changed.wait()

    async def _discard(self, container_id: str) -> None:
        self.transport.close(container_id)
        with contextlib.suppress(SandboxError):
            await self._run(self.engine.remove_container, container_id, abandon=True)

    async def _verified_image_id(self) -> str:
        """Resolve the allowlisted tag to its immutable ID; verify each new ID once, like ``verify-image``.

        A pass is remembered by the engine object for this process and, with a state directory, for later server
        processes too: an image ID names its content, so a verified ID stays verified (for this profile, these
        checks and this engine; see :func:`verification_key`).
        """
        spec = self.profile.image_spec()
        facts = await self._run(self.engine.image_facts, spec.tag)
        if facts is None:
            raise _image_invalid()
        verified = (self.profile.name, facts.id)
        async with self._image_lock:
            if verified not in self.engine.verified_images:
                key = await self._run(verification_key, self.engine, self.profile, facts.id)
                if self.verified is None or key not in self.verified:
                    report = await self._run(verify_image, self.engine, self.profile)
                    if not report.passed or report.image is None or report.image.id != facts.id:
                        raise _image_invalid()
                    if self.verified is not None:
                        await self._run(self.verified.add, key)
                self.engine.verified_images.add(verified)
        return facts.id

    # -- destroy ------------------------------------------------------------------------------------------------

    async def destroy(self, session_id: str) -> bool:
        """Remove a session's container. Idempotent: ``False`` when there was no such live session.

        A failed removal keeps the session (state ``destroying``) so that the reaper and later calls retry it.
        """
        session = self._sessions.get(session_id)
        if session is None or not session.container_id:
            return False
        was_live = session.state == "active"
        await self._remove(session)
        return was_live

    def retire(self, session_id: str) -> Session | None:
        """Take a live session out of use at once (its calls get ``INVALID_SESSION`` from now on); it still counts
        against the cap until :meth:`remove_quietly` (or the reaper, on a failure) has removed its container."""
        session = self._sessions.get(session_id)
        if session is None or not session.container_id:
            return None
        session.state = "destroying"
        return session

    async def remove_quietly(self, session: Session) -> None:
        """Remove a retired session's container; a failure leaves it to the reaper's retries."""
        with anyio.CancelScope(shield=True):
            await self._destroy_quietly(session)

    async def _remove(self, session: Session, *, abandon: bool = False) -> None:
        session.state = "destroying"
        try:
            await self._run(self.engine.remove_container, session.container_id, abandon=abandon)
        except SandboxError as error:
            logger.warning("session %s: container removal failed (%s); will retry", session.hash, error.code)
            raise SandboxError(
                ErrorCode.CONTAINER_REMOVAL_FAILED,
                "the sandbox could not be removed yet; it is disabled and removal will be retried",
            ) from None
        self.transport.close(session.container_id)
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
                        facts = await self._run(self.engine.container_facts, session.container_id)
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
            if not session.container_id:
                continue  # still being created
            if session.state == "destroying" or (self._expired(session, now) and not session.lock.locked()):
                with contextlib.suppress(SandboxError):
                    await self._remove(session)
                    removed += 1
        return removed

    async def run_reaper(self, interval: float = REAPER_INTERVAL_SECONDS) -> None:
        while True:
            await anyio.sleep(interval)
            try:
                await self.reap_once()
            except Exception:  # the reaper must survive anything, e.g. the daemon going away
                logger.warning("the session reaper failed a pass; it will try again")

    async def shutdown(self) -> None:
        """Remove every session and warm container of this server, bounded in time."""
        with anyio.move_on_after(SHUTDOWN_SECONDS, shield=True):
            async with anyio.create_task_group() as group:
                self._closing = True  # the pool filler stops, and discards what it was creating
                pooled, self._pool = [entry.container_id for entry in self._pool], []
                for container_id in [*pooled, *self._warming, *self._starting]:
                    group.start_soon(self._discard, container_id)
                for session in list(self._sessions.values()):
                    if session.container_id:
                        # Abandonable: a hung daemon must not hold shutdown past its bound; what is left is
                        # removed by the interpreter-exit handler or, at worst, by the container's watchdog.
                        group.start_soon(partial(self._destroy_quietly, session, abandon=True))
        self.transport.close_all()

    def remove_all_now(self) -> None:
        """Synchronous last resort for interpreter exit: remove what is left, ignoring failures."""
        for container_id in [*(pooled.container_id for pooled in self._pool), *self._warming, *self._starting]:
            with contextlib.suppress(Exception):
                self.engine.remove_container(container_id)
        self._pool = []
        for session in list(self._sessions.values()):
            if session.container_id:
                with contextlib.suppress(Exception):
                    self.engine.remove_container(session.container_id)
                    self._sessions.pop(session.id, None)

    async def _run(self, function: Callable[..., _T], *args: object, abandon: bool = False) -> _T:
        return await anyio.to_thread.run_sync(function, *args, abandon_on_cancel=abandon)


class _UidTaken(Exception):
    """The drawn sandbox uid is labelled on another container of this engine."""


def require_enforcement(daemon: DaemonFacts) -> None:
    """Refuse to start sandboxes on an engine that would silently weaken them."""
    if daemon.os_type != "linux" or not daemon.seccomp:
        raise SandboxError(
            ErrorCode.CONTAINER_UNAVAILABLE,
            "the Docker engine does not run Linux containers with seccomp enforced; sandboxes are refused "
            "rather than weakened",
            hint="use Docker Engine or Docker Desktop with Linux containers and its default seccomp profile",
        )


def _image_invalid() -> SandboxError:
    return SandboxError(
        ErrorCode.IMAGE_INVALID,
        "the sandbox image is missing or failed verification",
        hint="run `code-sandbox build-image --offline`, then `code-sandbox verify-image`",
    )
