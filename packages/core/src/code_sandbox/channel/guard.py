"""One leased sandbox as the file and run logic sees it: a transport, a target, and the fail-closed rule.

A :class:`Channel` is handed out by ``SessionManager.channel`` for the length of one lease. When a helper breaks
its protocol, hangs, or its container vanishes, :meth:`Channel.guard` destroys the session before the error
leaves, so no caller can forget to, and none can keep using an untrusted sandbox.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from code_sandbox.channel.transport import HelperCrash, Target, Transport
from code_sandbox.errors import ErrorCode, SandboxError

logger = logging.getLogger(__name__)

FailClosed = Callable[[SandboxError], Awaitable[SandboxError]]
"""Destroys the session, shielded from cancellation, and returns the error to raise: the one given, or
``CONTAINER_UNAVAILABLE`` when the container itself had vanished."""


@dataclass
class Channel:
    """The helpers of one leased sandbox.

    :param transport: how to reach the helpers.
    :param target: the sandbox's container and uid.
    :param fail_closed: destroys the session (see :data:`FailClosed`).
    :param seconds_left: how long the sandbox still lived when the lease began; a run must not outlast it.
    :param name: the session's hash, for logs.
    :param container_gone: asks the engine whether the container no longer runs (blocking; ``False`` when it cannot
        say). A call under way asks it now and then, and ends as soon as the answer is yes.
    """

    transport: Transport
    target: Target
    fail_closed: FailClosed
    seconds_left: float
    name: str = "-"
    container_gone: Callable[[], bool] | None = None

    @contextlib.asynccontextmanager
    async def guard(self, *, crashed: SandboxError, hung: SandboxError) -> AsyncGenerator[None]:
        """Destroy the session if the helper call inside crashes (raise ``crashed``), hangs (raise ``hung``) or
        finds its container gone (raise ``CONTAINER_UNAVAILABLE``). Other errors pass through untouched."""
        try:
            yield
        except HelperCrash as crash:
            logger.warning("sandbox %s: a helper failed (%s); it is destroyed", self.name, crash.cause or "no answer")
            raise await self.fail_closed(crashed) from None
        except SandboxError as error:
            if error.code == ErrorCode.TIMEOUT:
                raise await self.fail_closed(hung) from None
            if error.code == ErrorCode.CONTAINER_UNAVAILABLE:
                raise await self.fail_closed(error) from None
            raise


class Sandboxes(Protocol):
    """Where the file and run tools get a sandbox's channel from: ``SessionManager``, or a test's fake."""

    def channel(self, session_id: str) -> AbstractAsyncContextManager[Channel]:
        """Lease the session for one operation and hand out its channel."""
        ...
