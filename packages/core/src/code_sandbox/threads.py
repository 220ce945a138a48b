"""Worker-thread budgets: every blocking call runs in a thread drawn from the budget of its kind, so that no kind can
starve another.

anyio's default pool (40 threads, one per event loop) was shared by everything: 40 runs sleeping for 30 s held every
thread, and ``tools/list``, ``ping`` and a 41st sandbox's run waited for one (24 s measured). Now:

- ``calls``: a run, an evaluation or a file operation of a sandbox, for as long as its program runs. Calls on one
  sandbox take turns, so :data:`CALL_THREADS` is more than the most sandboxes a server may hold
  (:data:`~code_sandbox.limits.MAX_SESSIONS`): a call in progress always finds one, and one that found none would be
  refused (``SERVER_BUSY``) rather than left waiting. A cancelled call gives its place back at once (anyio's way with
  an abandoned thread); its thread ends once the cancel's kill-all has ended the program it waited for.
- ``engine``: a single engine request (create, start, signal, remove, inspect, a survey, a kill). Each is bounded by
  the engine's own timeout, so a request waits its turn; runs never hold these threads.
- ``wire``: writing a JSON-RPC line to the client, which must never wait behind either of the others.

The budgets are per event loop (a ``RunVar``, as anyio's own default), so a test's loops do not share them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeVar

import anyio.to_thread
from anyio import CapacityLimiter
from anyio.lowlevel import RunVar

from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.limits import MAX_SESSIONS

_T = TypeVar("_T")

CALL_THREADS = MAX_SESSIONS + 28
ENGINE_THREADS = 32
WIRE_THREADS = 2
Budget = Literal["calls", "engine", "wire"]
_SIZES: dict[Budget, int] = {"calls": CALL_THREADS, "engine": ENGINE_THREADS, "wire": WIRE_THREADS}
_LIMITERS: dict[Budget, RunVar[CapacityLimiter]] = {name: RunVar(f"code_sandbox_{name}_threads") for name in _SIZES}


def limiter(budget: Budget) -> CapacityLimiter:
    """The current event loop's limiter of ``budget``."""
    variable = _LIMITERS[budget]
    try:
        return variable.get()
    except LookupError:
        made = CapacityLimiter(_SIZES[budget])
        variable.set(made)
        return made


def server_busy() -> SandboxError:
    return SandboxError(
        ErrorCode.SERVER_BUSY,
        "the server is running as many calls as it can; try again when one has finished",
    )


async def in_call_thread(function: Callable[..., _T], *args: object, abandon: bool = True) -> _T:
    """``function(*args)`` in a thread of the ``calls`` budget; refused at once when none is left.

    :raises SandboxError: ``SERVER_BUSY``, before ``function`` is called.
    """
    budget = limiter("calls")
    if budget.available_tokens < 1:
        raise server_busy()
    return await anyio.to_thread.run_sync(function, *args, abandon_on_cancel=abandon, limiter=budget)


async def in_engine_thread(function: Callable[..., _T], *args: object, abandon: bool = False) -> _T:
    """``function(*args)``, one engine request, in a thread of the ``engine`` budget (waiting for its turn)."""
    return await anyio.to_thread.run_sync(function, *args, abandon_on_cancel=abandon, limiter=limiter("engine"))


async def in_wire_thread(function: Callable[..., _T], *args: object) -> _T:
    """``function(*args)``, a write to the client, in a thread of the ``wire`` budget."""
    return await anyio.to_thread.run_sync(function, *args, limiter=limiter("wire"))
