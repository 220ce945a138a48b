"""Reading ahead (code_sandbox.sandbox.read_ahead): a restore's engine answer is read by a thread of its own while the
sandbox takes the pieces already read. Every piece arrives, in order; a failure arrives after the pieces before it; a
close stops the reader, which closes what it read from in its own thread; it never holds more than its depth."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator

import pytest
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.sandbox import read_ahead
from code_sandbox.sandbox.read_ahead import ReadAhead


class _Source:
    """A generator-like source that records what was read, where it was closed, and can be held at a piece."""

    def __init__(self, count: int, *, fail_at: int | None = None) -> None:
        self.count = count
        self.fail_at = fail_at
        self.read = 0
        self.closed_in: str | None = None
        self.gate = threading.Event()
        self.gate.set()
        self._pieces = self._generate()

    def _generate(self) -> Generator[bytes]:
        try:
            for index in range(self.count):
                self.gate.wait()
                if index == self.fail_at:
                    raise SandboxError(ErrorCode.SNAPSHOT_INVALID, "changed")
                self.read += 1
                yield bytes([index % 256]) * 3
        finally:
            self.closed_in = threading.current_thread().name

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        return next(self._pieces)

    def close(self) -> None:
        self._pieces.close()


def _eventually(condition: object, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return True
        time.sleep(0.01)
    return False


def test_every_piece_arrives_in_order_and_the_source_is_closed_by_the_reader() -> None:
    source = _Source(50)
    ahead = ReadAhead(source, depth=3, name="reader under test")
    assert list(ahead) == [bytes([index]) * 3 for index in range(50)]
    assert ahead.join(5)
    assert source.closed_in == "reader under test"  # never from the consumer's thread: a generator runs in one


def test_a_failure_arrives_after_the_pieces_before_it_and_ends_the_iterator() -> None:
    ahead = ReadAhead(_Source(10, fail_at=4), depth=2)
    got = [next(ahead) for _ in range(4)]
    assert got == [bytes([index]) * 3 for index in range(4)]
    with pytest.raises(SandboxError) as raised:
        next(ahead)
    assert raised.value.code == ErrorCode.SNAPSHOT_INVALID
    with pytest.raises(StopIteration):
        next(ahead)


def test_it_reads_no_more_than_its_depth_ahead() -> None:
    source = _Source(100)
    ahead = ReadAhead(source, depth=4)
    assert _eventually(lambda: source.read >= 5)
    time.sleep(0.2)
    # Four wait in the queue and a fifth in the reader's hand, waiting for room.
    assert source.read == 5
    assert next(ahead) == bytes([0]) * 3
    assert _eventually(lambda: source.read == 6)
    ahead.close()
    assert ahead.join(5)


def test_a_close_stops_a_reader_waiting_for_room_and_closes_the_source() -> None:
    source = _Source(100)
    ahead = ReadAhead(source, depth=1, name="stopped reader")
    assert _eventually(lambda: source.read == 2)  # one queued, one waiting for room
    ahead.close()
    assert ahead.join(5)
    assert source.closed_in == "stopped reader"
    assert source.read == 2
    with pytest.raises(StopIteration):
        next(ahead)


def test_a_close_while_the_source_is_blocked_lets_the_reader_end_when_the_source_answers() -> None:
    source = _Source(100)
    source.gate.clear()  # the engine is slow to answer
    ahead = ReadAhead(source, depth=2)
    ahead.close()
    assert not ahead.join(0.2)  # a reader inside the source waits for it, as an engine read waits for its timeout
    source.gate.set()
    assert ahead.join(5)
    assert source.read <= 1  # it stopped at its next piece
    assert source.closed_in is not None


def test_a_consumer_waiting_for_a_piece_in_another_thread_is_let_go_by_a_close() -> None:
    # A cancelled restore abandons the thread that sends the pieces to the sandbox; the close that follows must not
    # leave it waiting for a piece that the stopped reader will never queue.
    source = _Source(100)
    source.gate.clear()
    ahead = ReadAhead(source, depth=2)
    outcome: list[object] = []
    consumer = threading.Thread(target=lambda: outcome.append(list(ahead)))
    consumer.start()
    time.sleep(0.2)
    assert consumer.is_alive()
    ahead.close()
    consumer.join(5)
    assert not consumer.is_alive() and outcome == [[]]
    source.gate.set()
    assert ahead.join(5)


def test_a_reader_nobody_takes_from_stops_by_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(read_ahead, "IDLE_SECONDS", 0.5)
    source = _Source(100)
    ahead = ReadAhead(source, depth=1, name="forgotten reader")  # and never taken from nor closed
    assert ahead.join(5)
    assert source.read == 2 and source.closed_in == "forgotten reader"
