"""The sandboxes of one server process, started and stopped as one: the session manager, its background work (the
start-up sweep, the reaper, the warm pool), the liveness marker and the audit log; and the one-shot, a run in a
sandbox of its own, which the one-shot tool and ``code-sandbox run`` both are.

It imports no MCP code, so that ``serve`` can start it, and the pool can fill, while the SDK is still loading.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from pathlib import Path

import anyio
import anyio.abc
import anyio.to_thread

from code_sandbox.docker_engine import DockerEngine
from code_sandbox.engine import Engine
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import LABEL_TAG
from code_sandbox.image import VerifiedImages
from code_sandbox.liveness import ServerMarker, default_state_dir
from code_sandbox.profile import Profile
from code_sandbox.sandbox import snapshots
from code_sandbox.sandbox.audit import AuditLog
from code_sandbox.sandbox.execution import prepare_program, run_prepared
from code_sandbox.sandbox.relay import OutputSink, Progress
from code_sandbox.sandbox.results import RunResult
from code_sandbox.sandbox.sessions import Session, SessionManager
from code_sandbox.sandbox.snapshot_content import Content
from code_sandbox.sandbox.snapshot_store import SnapshotInfo, SnapshotStore
from code_sandbox.sandbox.sweep import sweep_managed
from code_sandbox.sandbox.workspace import prepare_write
from code_sandbox.settings import Settings
from code_sandbox.threads import in_engine_thread

logger = logging.getLogger(__name__)


SNAPSHOT_SLOTS = 2
"""Snapshots taken, restored or forked at once; more wait their turn. Each holds up to a workspace's bytes a few
times over in this process (read, checked, encoded)."""
ONE_SHOT_MARGIN_SECONDS = 30.0
"""A one-shot sandbox is needed for its run's timeout and this much more (the host's grace, cleanup, the survey)."""


class SandboxService:
    """Everything a server needs to serve sandboxes for one profile, apart from the protocol."""

    def __init__(
        self,
        settings: Settings,
        profile: Profile,
        *,
        engine: Engine | None = None,
        state_dir: Path | None = None,
    ) -> None:
        self.settings = settings
        self.profile = profile
        self.engine = engine or DockerEngine.for_settings(settings)
        self.state_dir = state_dir or default_state_dir()
        verified = VerifiedImages(self.state_dir / "verified-images")
        self.manager = SessionManager(self.engine, profile, settings, verified=verified)
        self.snapshots = SnapshotStore(self.engine, settings, profile.name, self.state_dir)
        self.audit = AuditLog(settings.audit_log, enabled=settings.audit_enabled)
        self._running = False
        self._snapshot_slots: anyio.CapacityLimiter | None = None
        self._background: anyio.abc.TaskGroup | None = None
        """While running with background work: work that outlives a call (a one-shot sandbox's removal) runs in
        this task group."""

    @contextlib.asynccontextmanager
    async def running(self, *, background: bool = True) -> AsyncGenerator[None]:
        """Hold the liveness marker and run the background work until the block ends, then remove every sandbox;
        re-entering a running service does nothing (``serve`` starts it before the MCP server, whose lifespan
        enters it again).

        :param background: a server's work besides its calls: the start-up sweep, the reaper, the warm pool, and
            one-shot sandboxes removed after their reply. Without it (a command that makes one sandbox), a
            one-shot's sandbox is removed before its result returns, and an error leaves the block as it was raised.
        """
        if self._running:
            yield None
            return
        # Held until the end: while this lock is held, other servers' sweeps leave our containers alone, and once
        # the process is gone (however it ended) they may remove what it left.
        marker = await anyio.to_thread.run_sync(ServerMarker.acquire, self.state_dir)
        self.manager.provisioner.owner = marker.owner
        atexit.register(self.manager.remove_all_now)
        self._running = True
        try:
            async with contextlib.AsyncExitStack() as stack:
                if background:
                    group = await stack.enter_async_context(anyio.create_task_group())
                    stack.callback(group.cancel_scope.cancel)  # once every sandbox is removed
                    self._background = group
                    group.start_soon(self._sweep)
                    group.start_soon(self.manager.run_reaper)
                    group.start_soon(self.manager.pool.run)
                try:
                    yield None
                finally:
                    with anyio.CancelScope(shield=True):
                        await self.manager.shutdown()
        finally:
            self._running = False
            self._background = None
            self.audit.close()
            left = len(self.manager)
            if not left:  # else the exit handler gets one more try at what shutdown could not remove
                atexit.unregister(self.manager.remove_all_now)
            marker.release(leave_marker=left > 0)  # a marker left behind reads "dead": its orphans get swept

    async def create(self, *, from_snapshot: str | None = None, fork_of: str | None = None) -> Session:
        """``create_sandbox``: an empty sandbox, or one that starts with a snapshot's files or a copy of a live
        sandbox's (:mod:`code_sandbox.sandbox.snapshots`), handed out only once they are all in place."""
        if from_snapshot is None and fork_of is None:
            return await self.manager.create()
        async with self._slots():
            if from_snapshot is not None:
                session, _content = await snapshots.restore(self.manager, self.snapshots, from_snapshot)
            else:
                assert fork_of is not None  # noqa: S101 - one of the two, checked above
                session, _content = await snapshots.fork(self.manager, fork_of)
        return session

    async def snapshot(self, session_id: str, name: str | None) -> tuple[SnapshotInfo, Content]:
        """``snapshot_sandbox``: keep a sandbox's workspace on the engine as ``name`` (or a generated name); what was
        kept, and its content."""
        async with self._slots():
            return await snapshots.take(self.manager, self.snapshots, session_id, name or snapshots.generated_name())

    async def list_snapshots(self) -> list[SnapshotInfo]:
        return await in_engine_thread(self.snapshots.live)

    def _slots(self) -> anyio.CapacityLimiter:
        if self._snapshot_slots is None:
            self._snapshot_slots = anyio.CapacityLimiter(SNAPSHOT_SLOTS)
        return self._snapshot_slots

    async def execute(
        self,
        files: Sequence[tuple[str, str | bytes]],
        entrypoint: str,
        arguments: Sequence[str],
        *,
        timeout_seconds: int | None,
        progress: Progress | None = None,
        output: OutputSink | None = None,
        on_created: Callable[[Session], None] | None = None,
    ) -> RunResult:
        """A one-shot: write ``files`` into a new sandbox and run ``entrypoint``, one of them, as one request; the
        sandbox is removed after the result goes out (:meth:`remove_after_reply`).

        Everything is checked before a sandbox is taken. ``on_created`` hears of the sandbox once it exists.
        """
        write = prepare_write(files, overwrite=False)
        program = prepare_program(self.manager, entrypoint, arguments, timeout_seconds=timeout_seconds)
        if program.entrypoint not in (path for path, _data in write.files):
            raise SandboxError(ErrorCode.INVALID_REQUEST, "the entrypoint must be one of the files")
        # The one-shot's whole life: its run, the host's grace past the run's deadline, and its cleanup's proof.
        session = await self.manager.create(needed_seconds=program.timeout_seconds + ONE_SHOT_MARGIN_SECONDS)
        if on_created is not None:
            on_created(session)
        try:
            return await run_prepared(self.manager, session.id, program, files=write, progress=progress, output=output)
        finally:
            await self.remove_after_reply(session.id)

    async def destroy(self, session_id: str) -> bool:
        """``destroy_sandbox``: the sandbox is out of use and its container told to stop when this returns
        (:meth:`SessionManager.stop`); the removal is confirmed after the reply, as for a one-shot. Idempotent:
        ``False`` when there was no live sandbox."""
        stopped = await self.manager.stop(session_id)
        if stopped is None:
            return False
        await self._confirm_removal(stopped)
        return True

    async def remove_after_reply(self, session_id: str) -> None:
        """Take a one-shot's sandbox out of use now and remove its container in the background, so that the result
        goes out first. Until Docker confirms the removal, the sandbox still counts against the cap; a failed
        removal is retried by the reaper."""
        retired = self.manager.retire(session_id)
        if retired is not None:
            await self._confirm_removal(retired)

    async def _confirm_removal(self, session: Session) -> None:
        """Remove a retired session's container after the reply (in the background work), or now when the service
        runs without it; a failed removal is retried by the reaper."""
        if self._background is not None:
            self._background.start_soon(self.manager.remove_quietly, session)
        else:
            with anyio.CancelScope(shield=True):
                await self.manager.remove_quietly(session)

    async def _sweep(self) -> None:
        # A tagged server (CODE_SANDBOX_TAG) judges only its tag's containers: other clients' are theirs to sweep.
        tag = self.engine.labels.get(LABEL_TAG)
        try:
            await in_engine_thread(
                lambda: sweep_managed(
                    self.engine, max_lifetime=self.settings.max_lifetime, state_dir=self.state_dir, tag=tag
                )
            )
        except SandboxError as error:
            logger.warning("start-up sweep skipped: %s", error.for_operator())
        try:
            removed = await in_engine_thread(self.snapshots.remove_expired)
        except SandboxError as error:
            logger.warning("expired snapshots not removed: %s", error.for_operator())
        else:
            if removed:
                logger.info("%d snapshot(s) past their age limit removed", removed)
