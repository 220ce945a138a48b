"""Container provisioning: the verified image, hardened containers with a freshly drawn sandbox uid, and their removal.

Every container a session or the warm pool gets is made here; nothing here knows which of the two it is for.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
from collections.abc import Callable
from functools import partial
from typing import NamedTuple, TypeVar

import anyio

from code_sandbox.channel.protocol import ReadyAnswer
from code_sandbox.channel.transport import Target, Transport, runtime_argv
from code_sandbox.engine import DaemonFacts, Engine
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import (
    LABEL_EXPIRES_AT,
    LABEL_HOST,
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
from code_sandbox.image.package_sets import packages_of
from code_sandbox.limits import MEMORY_BYTES, SANDBOX_BACKING_BYTES, MiB, sessions_backed
from code_sandbox.liveness import machine_name
from code_sandbox.profile import WATCHDOG_LIFELINE, Profile
from code_sandbox.settings import Settings, SettingsError, env_name
from code_sandbox.threads import in_engine_thread
from code_sandbox.timeline import milestone

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

WATCHDOG_GRACE_SECONDS = 2
"""The container outlives the host-side deadline by this much, so the host always expires a session first."""
WATCHDOG_READY_SECONDS = 10.0
"""How long a new container's watchdog may take to get ready for its claim signal."""
UID_ATTEMPTS = 5
"""A uid already labelled on another live container is given up and another one drawn, this many times."""


async def run_sync(function: Callable[..., _T], *args: object, abandon: bool = False) -> _T:
    """Call a blocking (Docker) function in a worker thread of the engine's budget (:mod:`code_sandbox.threads`), so
    that one slow call never stalls another session and no run holds the thread an engine request needs."""
    return await in_engine_thread(function, *args, abandon=abandon)


class Provisioned(NamedTuple):
    """A container just made: its ID (core-internal), its sandbox uid, and the packages its image vendors."""

    container_id: str
    uid: int
    packages: tuple[str, ...] = ()
    ends_by: float | None = None
    """A warm container handed out unclaimed (:meth:`WarmPool.claim` with ``needed_seconds``): when, on the manager's
    clock, its watchdog ends it (with the pool's margin); ``None``: a session's full lifetime from now."""


def draw_uid() -> int:
    """A sandbox uid drawn at random from the range; collisions are caught by the label check, not avoided here."""
    return SANDBOX_UIDS[secrets.randbelow(len(SANDBOX_UIDS))]


class Provisioner:
    """Makes and discards the containers of one server process."""

    def __init__(
        self,
        engine: Engine,
        profile: Profile,
        settings: Settings,
        *,
        owner: str,
        transport: Transport,
        verified: VerifiedImages | None,
    ) -> None:
        self.engine = engine
        self.profile = profile
        self.settings = settings
        self.owner = owner
        """This server process; labels every container made from now on."""
        self.transport = transport
        """How calls reach the helpers inside the sandboxes."""
        self.verified = verified
        """Image verifications that earlier server processes recorded (the state directory), if any."""
        self._image_lock = anyio.Lock()
        self._packages: dict[str, tuple[str, ...]] = {}  # verified image ID -> the packages its labels list
        self._image_environment: dict[str, tuple[str, ...]] = {}  # verified image ID -> the variables it sets
        self._starting: set[str] = set()  # created, not yet handed to a session or the pool (set by a worker thread)

    @property
    def starting(self) -> list[str]:
        """Containers created and not yet handed over: a shutdown meanwhile must remove them itself."""
        return [*self._starting]

    async def image_packages(self) -> tuple[str, ...]:
        """The packages vendored in the image that new containers are made from, verified like a create's."""
        return self._packages[await self._verified_image_id()]

    async def create_container(self, label_session: str, *, pool_seconds: int | None = None) -> Provisioned:
        """Create and start a hardened container whose watchdog enforces the session's hard lifetime.

        With ``pool_seconds`` the container waits in the warm pool: it dies by itself after that long unless a
        claim moves its deadline to a full session lifetime from the moment of the claim.
        """
        image_id = await self._verified_image_id()
        milestone("engine answered, image verified")
        daemon = await run_sync(self.engine.daemon_facts)
        require_enforcement(daemon)
        require_capacity(daemon, self.settings)
        session_seconds = self.settings.max_lifetime + WATCHDOG_GRACE_SECONDS
        watchdog = await run_sync(runtime_argv, self.engine, self.profile, self.profile.helper_argv("watchdog"))
        watchdog.append(WATCHDOG_LIFELINE)  # the container ends when this server's hold on its stdin goes
        # The label is written before the create call, and the container may start as late as the engine's
        # timeout after it: the margin keeps another server's sweep from taking a live session for expired. In the
        # engine's time, which every server sharing the engine reads alike.
        latest_end = int(self.engine.now()) + session_seconds + self.engine.timeout
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
                    LABEL_HOST: machine_name(),
                    LABEL_PROFILE: self.profile.name,
                    LABEL_EXPIRES_AT: str(latest_end),
                    LABEL_SESSION: label_session,
                    LABEL_UID: str(uid),
                },
                apparmor=daemon.apparmor,
                uid=uid,
                lifeline=True,
                image_environment=self._image_environment[image_id],
            )
            try:
                container_id = await run_sync(
                    partial(self.engine.create_container, request, before_start=partial(self._before_start, uid))
                )
            except _UidTaken:
                logger.info("a drawn sandbox uid was in use on this engine; drawing another")
                continue
            # Handed over without an await in between: the caller records it as a session's or the pool's.
            self._starting.discard(container_id)
            milestone("first container started")
            return Provisioned(container_id, uid, self._packages[image_id])
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

    async def watchdog_ready(self, container_id: str, uid: int) -> bool:
        """Wait until the watchdog can take its claim signal; claimed any sooner, it would die of it."""
        ask = partial(self.transport.watchdog_ready, Target(container_id, user_of(uid)), timeout=5)
        with anyio.move_on_after(WATCHDOG_READY_SECONDS):
            while True:
                try:
                    answer = await run_sync(ask)
                except SandboxError:
                    return False
                if isinstance(answer, ReadyAnswer) and answer.ready:
                    return True
                await anyio.sleep(0.02)
        return False

    def prepare_soon(self, container_id: str, uid: int) -> None:
        """Open a new container's channels on a thread of their own, so that its first call finds them open (or
        waits for them, not longer); a failure here is left to that call, which opens them itself."""
        target = Target(container_id, user_of(uid))

        def prepare_quietly() -> None:
            with contextlib.suppress(Exception):
                self.transport.prepare(target)

        threading.Thread(target=prepare_quietly, name="code-sandbox prepare", daemon=True).start()

    async def discard(self, container_id: str) -> None:
        """Remove a container that no session holds, ignoring failures (its watchdog removes it at worst)."""
        self.transport.close(container_id)
        with contextlib.suppress(SandboxError):
            await run_sync(self.engine.remove_container, container_id, abandon=True)

    async def _verified_image_id(self) -> str:
        """Resolve the allowlisted tag to its immutable ID; verify each new ID once, like ``verify-image``.

        A pass is remembered by the engine object for this process and, with a state directory, for later server
        processes too: an image ID names its content, so a verified ID stays verified (for this profile, these
        checks and this engine; see :func:`verification_key`).
        """
        spec = self.profile.image_spec()
        facts = await run_sync(self.engine.image_facts, spec.tag)
        if facts is None:
            raise _image_invalid()
        verified = (self.profile.name, facts.id)
        async with self._image_lock:
            if verified not in self.engine.verified_images:
                key = await run_sync(verification_key, self.engine, self.profile, facts.id)
                if self.verified is None or key not in self.verified:
                    report = await run_sync(verify_image, self.engine, self.profile)
                    if report.engine_fault is not None:
                        raise report.engine_fault
                    if not report.passed or report.image is None or report.image.id != facts.id:
                        raise _image_invalid()
                    if self.verified is not None:
                        await run_sync(self.verified.add, key)
                self.engine.verified_images.add(verified)
            if facts.id not in self._packages:
                packages = packages_of(facts.labels)  # the tree was checked against them when the ID was verified
                if packages is None:
                    raise _image_invalid()
                self._packages[facts.id] = packages
                self._image_environment[facts.id] = facts.config.env_names
        return facts.id


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


def require_capacity(daemon: DaemonFacts, settings: Settings) -> None:
    """Refuse a ``CODE_SANDBOX_MAX_SESSIONS`` that the engine host's memory cannot back (``limits.sessions_backed``);
    an engine that does not report its memory is not judged."""
    backed = sessions_backed(daemon.memory_bytes)
    if daemon.memory_bytes and settings.max_sessions > backed:
        raise SettingsError(
            env_name("max_sessions"),
            f"is more than the engine's memory can back: {daemon.memory_bytes / (1024 * MiB):.1f} GiB holds {backed} "
            f"sandboxes ({SANDBOX_BACKING_BYTES // MiB} MiB each, one of them at its full {MEMORY_BYTES // MiB} MiB)",
            hint=f"set {env_name('max_sessions')} to {backed} or less, or give the engine more memory",
        )


def _image_invalid() -> SandboxError:
    return SandboxError(
        ErrorCode.IMAGE_INVALID,
        "the sandbox image is missing or failed verification",
        hint="run `code-sandbox build-image --offline`, then `code-sandbox verify-image`",
    )
