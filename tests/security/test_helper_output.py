"""Helper output as an attack: whatever a helper writes, the host parses it strictly or destroys the sandbox.

User code can no longer reach the runner's pipes (see test_trust_boundary.py), so these faults are injected at the
transport, around a real container: the real helper answers on its channel (or, for an exit code, in an exec),
then what the host reads is replaced or extended.
"""

from __future__ import annotations

import contextlib
import threading
import time
from functools import partial

import anyio
import anyio.to_thread
import pytest
from code_sandbox.channel.protocol import KillAllAnswer
from code_sandbox.channel.transport import HelperCrash, HelperExecs, StderrSink, Target, runtime_argv
from code_sandbox.engine import ExecRequest, ExecResult
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import SUPERVISOR_USER
from code_sandbox.sandbox.execution import run_entrypoint
from code_sandbox.sandbox.relay import PROGRESS_BURST, UpdateBudget
from code_sandbox.sandbox.sessions import Session, SessionManager
from code_sandbox.sandbox.workspace import list_files, write_files

from tests.support.edited_transport import LineEdit, edited_execs, edited_transport, install, is_kill_all

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]


@pytest.fixture
async def session(manager: SessionManager) -> Session:
    session = await manager.create()
    await write_files(manager, session.id, [("main.js", "console.log('hi')")], overwrite=False)
    return session


def _poison_stderr(poison: bytes) -> LineEdit:
    def edit(line: bytes, on_stderr: StderrSink | None) -> bytes:
        assert on_stderr is not None
        on_stderr(poison + b"\n")
        return line

    return edit


def _replace_answer(answer: bytes) -> LineEdit:
    return lambda _line, _on_stderr: answer


async def _progress(_elapsed: float, _output: int) -> None:
    return None


@pytest.mark.parametrize(
    "edit",
    [
        _poison_stderr(b'{"elapsed_ms":1,"stdout_bytes":1e999,"stderr_bytes":0}'),
        _poison_stderr(b'{"elapsed_ms":1,"stdout_bytes":-1,"stderr_bytes":0}'),
        _poison_stderr(b"[" * 100_000 + b"]" * 100_000),
        _poison_stderr(b'{"stream":"stdout","b64":"not base64!"}'),
        _replace_answer(b"[" * 100_000 + b"]" * 100_000),
        _replace_answer(b'{"ok":true,"exit_code":0}'),
        _replace_answer(b'{"ok":true,"exit_code":1e999}'),
        _replace_answer(b'{"ok":false,"code":"SPAWN_FAILED","message":"x"}'),
    ],
    ids=[
        "huge-float",
        "negative-count",
        "deep-nesting",
        "bad-piece",
        "deep-answer",
        "short-answer",
        "float-exit",
        "refusal",
    ],
)
async def test_malformed_runner_output_destroys_the_session_with_a_stable_code(
    manager: SessionManager, session: Session, edit: LineEdit
) -> None:
    install(manager, edited_transport(manager, "run", edit))
    with pytest.raises(SandboxError) as caught:
        await run_entrypoint(manager, session.id, "main.js", [], timeout_seconds=10, progress=_progress)
    assert caught.value.code == ErrorCode.SUPERVISOR_FAILED
    assert len(manager) == 0 and manager.provisioner.engine.container_facts(session.container_id) is None


@pytest.mark.runc_only(
    "the exec form's exit code: under jailed runs the kill-all is read from a held exec, like the channel, whose answer "
    "line is the whole answer"
)
async def test_a_valid_answer_with_a_nonzero_exit_is_a_crash(manager: SessionManager, session: Session) -> None:
    def nonzero_exit(_argv: list[str], result: ExecResult, _on_stderr: StderrSink | None) -> ExecResult:
        return ExecResult(1, result.stdout, result.stderr)

    # The exec form (the kill-all, the watchdog check): the one place a helper has an exit code of its own.
    execs = edited_execs(manager.provisioner.engine, manager.provisioner.profile, is_kill_all, nonzero_exit)
    target = Target(session.container_id, session.user)
    with pytest.raises(HelperCrash) as caught:
        await anyio.to_thread.run_sync(partial(execs.kill_all, target, timeout=30))
    assert caught.value.cause == "exit code 1, 1 answer line(s)"
    honest = HelperExecs(manager.provisioner.engine, manager.provisioner.profile)
    assert isinstance(await anyio.to_thread.run_sync(partial(honest.kill_all, target, timeout=30)), KillAllAnswer)


@pytest.mark.parametrize(
    "stdout",
    [
        b'{"ok":true,"entries":[{"path":"a","type":"file","size":"12"}],"truncated":false}\n',
        b'{"ok":true,"entries":[{"path":"a","type":"fifo","size":1}],"truncated":false}\n',
        b'{"ok":true,"entries":[],"truncated":false,"extra":1}\n',
        b'{"ok":true,"entries":[{"path":"a","type":"file","size":9007199254740993}],"truncated":false}\n',
    ],
    ids=["string-size", "unknown-type", "unknown-key", "size-past-2^53"],
)
async def test_malformed_file_helper_answers_destroy_the_session(
    manager: SessionManager, session: Session, stdout: bytes
) -> None:
    install(manager, edited_transport(manager, "list", _replace_answer(stdout.rstrip())))
    with pytest.raises(SandboxError) as caught:
        await list_files(manager, session.id, ".", recursive=True, max_depth=2)
    assert caught.value.code == ErrorCode.TRANSFER_FAILED and "destroyed" in caught.value.message
    assert len(manager) == 0


async def test_a_flood_of_progress_lines_is_dropped_unparsed_past_the_budget(
    manager: SessionManager, session: Session
) -> None:
    line = b'{"elapsed_ms":1,"stdout_bytes":1,"stderr_bytes":1}\n'
    flood = line * (8 * 1024 * 1024 // len(line))

    def edit(line: bytes, on_stderr: StderrSink | None) -> bytes:
        assert on_stderr is not None
        for start in range(0, len(flood), 65536):
            on_stderr(flood[start : start + 65536])
        return line

    updates: list[float] = []

    async def progress(elapsed: float, _output: int) -> None:
        updates.append(elapsed)

    install(manager, edited_transport(manager, "run", edit))
    result = await run_entrypoint(manager, session.id, "main.js", [], timeout_seconds=10, progress=progress)
    assert (result.exit_code, result.stdout) == (0, "hi\n")
    # 160k lines arrive within a fraction of a second: the burst and a few refills are parsed, the rest dropped.
    assert 1 <= len(updates) <= PROGRESS_BURST + 10, len(updates)


def test_the_update_budget_refills_at_its_rate_and_counts_what_it_drops() -> None:
    now = [0.0]
    budget = UpdateBudget(rate=4, burst=8, clock=lambda: now[0])
    assert [budget.take() for _ in range(10)] == [True] * 8 + [False] * 2
    now[0] += 1.0
    assert [budget.take() for _ in range(5)] == [True] * 4 + [False]
    now[0] += 100.0
    assert sum(budget.take() for _ in range(20)) == 8
    assert budget.dropped == 2 + 1 + 12


@pytest.mark.serial  # the survivor's exec must start while the answer is held: beside other tests it took over 10 s
async def test_a_process_that_survives_the_run_destroys_the_session(manager: SessionManager, session: Session) -> None:
    # A process of the sandbox uid that the runner did not kill (here: started by a second exec just as the run
    # ends, standing in for one that escaped the runner's kill) must be found by the supervisor's survey.
    real = manager.provisioner.engine
    survivor_started = threading.Event()

    def start_survivor() -> None:
        with contextlib.suppress(SandboxError):  # the container is removed under it
            argv = runtime_argv(
                real, manager.provisioner.profile, ["/usr/local/bin/node", "-e", "setTimeout(() => {}, 30000)"]
            )
            real.exec(session.container_id, ExecRequest(argv, user=session.user, timeout=40, max_stdout=1024,
                      on_stderr=lambda _chunk: None, exit_code=False))  # fmt: skip

    def edit(line: bytes, _on_stderr: StderrSink | None) -> bytes:
        threading.Thread(target=start_survivor, daemon=True).start()
        deadline = time.monotonic() + 10
        while not survivor_started.is_set() and time.monotonic() < deadline:
            count = runtime_argv(real, manager.provisioner.profile, ["/usr/local/bin/node", "-e", _COUNT])
            probe = real.exec(session.container_id, ExecRequest(count, user=SUPERVISOR_USER,
                              timeout=10, max_stdout=1024))  # fmt: skip
            if probe.stdout.strip() != b"0":
                survivor_started.set()
        return line

    install(manager, edited_transport(manager, "run", edit))
    with pytest.raises(SandboxError) as caught:
        await run_entrypoint(manager, session.id, "main.js", [], timeout_seconds=10)
    assert survivor_started.is_set()
    assert caught.value.code == ErrorCode.PROCESS_CLEANUP_FAILED
    assert len(manager) == 0 and real.container_facts(session.container_id) is None


_COUNT = """
const fs = require('fs');
console.log(fs.readdirSync('/proc').filter((p) => /^\\d+$/.test(p)).filter((p) => {
  try { const uid = +fs.readFileSync(`/proc/${p}/status`, 'latin1').match(/Uid:\\s+(\\d+)/)[1];
        const channel = fs.readFileSync(`/proc/${p}/cmdline`, 'latin1').includes('--channel');
        return uid !== 0 && uid !== 65533 && !channel; } catch { return false; } }).length);
"""


async def test_chatty_honest_output_streams_whole_and_never_overflows_the_helpers_stderr(
    manager: SessionManager, session: Session
) -> None:
    # 300k one-byte writes per stream, then a line every 100 ms for 2 s: streamed piece by piece, this would be
    # far more than the 8 MiB the host reads from the runner's stderr, and far more lines than it parses.
    # Under gVisor every write is a system call its kernel serves in user space, a hundred times slower: fewer.
    writes = 30000 if manager.provisioner.engine.runtime_in_force().user_space_kernel else 300000
    source = f"""
for (let i = 0; i < {writes}; i++) {{ process.stdout.write('o'); process.stderr.write('e'); }}
let n = 0; const t = setInterval(() => {{ console.log(`line ${{n}}`); if (++n === 20) clearInterval(t); }}, 100);
"""
    await write_files(manager, session.id, [("chatty.js", source)], overwrite=True)
    streamed: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}

    async def output(stream: str, data: bytes) -> None:
        streamed[stream].extend(data)

    result = await run_entrypoint(manager, session.id, "chatty.js", [], timeout_seconds=30, output=output)
    expected = "o" * writes + "".join(f"line {n}\n" for n in range(20))
    assert (result.exit_code, result.stdout, result.stderr) == (0, expected, "e" * writes)
    assert bytes(streamed["stdout"]) == expected.encode() and bytes(streamed["stderr"]) == b"e" * writes


async def test_a_write_answer_with_the_wrong_number_of_results_destroys_the_session(
    manager: SessionManager, session: Session
) -> None:
    answer = b'{"ok":true,"results":["written"],"entries":3,"bytes":10}'
    install(manager, edited_transport(manager, "write", _replace_answer(answer)))
    with pytest.raises(SandboxError) as caught:
        await write_files(manager, session.id, [("a.txt", "a"), ("b.txt", "b")], overwrite=False)
    assert caught.value.code == ErrorCode.TRANSFER_FAILED and "destroyed" in caught.value.message
    assert len(manager) == 0
