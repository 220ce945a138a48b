"""What the wire can carry, attacked over a real ``code-sandbox serve``: a client line that is no JSON-RPC message
gets exactly one error answer, carrying nothing of the line but a usable id, and the server serves on; every line
the server writes is one line on any terminal, with its invisible and line-breaking characters escaped."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_server import SECRET
from tests.test_startup import INITIALIZE, RawClient, record_of, session

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("image_id", "cleanup_managed")]

PARSE_ERROR = {"code": -32700, "message": "Parse error"}
INVALID_REQUEST = {"code": -32600, "message": "Invalid Request"}
LIST = {"jsonrpc": "2.0", "id": "list", "method": "tools/list"}
SECRET_BYTES = SECRET.encode()


def request(body: bytes) -> bytes:
    """A ``tools/list`` request whose params are ``body``, raw, with the secret marker beside them."""
    head = b'{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{"marker":"' + SECRET_BYTES
    return head + b'","x":' + body + b"}}"


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# Each line, then the error that must answer it (with the id it must carry).
BAD_LINES: list[tuple[str, bytes, dict[str, Any], int | str | None]] = [
    ("invalid UTF-8 inside a string", request(b'"\xff\xfe"'), PARSE_ERROR, None),
    ("an overlong UTF-8 slash", request(b'"\xc0\xaf"'), PARSE_ERROR, None),
    ("an encoded surrogate", request(b'"\xed\xa0\x80"'), PARSE_ERROR, None),
    ("a lone surrogate escape", request(b'"\\ud800"'), PARSE_ERROR, None),
    ("a lone surrogate that a repeated key replaces", request(b'"\\ud800","x":1'), PARSE_ERROR, None),
    ("a lone surrogate after an escaped backslash", request(b'"\\ud800\\\\\\udc00"'), PARSE_ERROR, None),
    ("a lone low surrogate in a key", b'{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{"\\udc00":1}}', PARSE_ERROR, None),
    ("200,000 arrays deep", nested(200_000), PARSE_ERROR, None),
    ("one past the depth bound", request(nested(63)), PARSE_ERROR, None),  # 65 with the envelope and params
    ("more values than the bound", request(b"[" + b"0," * 100_000 + b"0]"), PARSE_ERROR, None),
    ("not JSON", b"GET / HTTP/1.1 " + SECRET_BYTES, PARSE_ERROR, None),
    ("a cut-off message", request(b"1")[:-3], PARSE_ERROR, None),
    ("NaN", request(b"NaN"), PARSE_ERROR, None),
    ("a byte order mark", b"\xef\xbb\xbf" + request(b"1"), PARSE_ERROR, None),
    ("two messages on one line", request(b"1") + request(b"1"), PARSE_ERROR, None),
    ("a number", b"42", INVALID_REQUEST, None),
    ("a string", json.dumps(SECRET).encode(), INVALID_REQUEST, None),
    ("an empty array", b"[]", INVALID_REQUEST, None),
    ("a batch", b"[" + request(b"1") + b"]", INVALID_REQUEST, None),
    ("no jsonrpc member", b'{"id":5,"method":"tools/list"}', INVALID_REQUEST, 5),
    ("JSON-RPC 1.0", b'{"jsonrpc":"1.0","id":"one","method":"tools/list"}', INVALID_REQUEST, "one"),
    ("a boolean id", b'{"jsonrpc":"2.0","id":true,"method":"tools/list"}', INVALID_REQUEST, None),
    ("a fractional id", b'{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}', INVALID_REQUEST, None),
    ("an object id", b'{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}', INVALID_REQUEST, None),
    ("a null request id", b'{"jsonrpc":"2.0","id":null,"method":"tools/list"}', INVALID_REQUEST, None),
    ("a method that is no string", b'{"jsonrpc":"2.0","id":"m","method":7}', INVALID_REQUEST, "m"),
    ("params by position", b'{"jsonrpc":"2.0","id":6,"method":"tools/list","params":[1]}', INVALID_REQUEST, 6),
    ("a notification with a bad method", b'{"jsonrpc":"2.0","method":null}', INVALID_REQUEST, None),
    ("neither method, result nor error", b'{"jsonrpc":"2.0","id":"r"}', INVALID_REQUEST, "r"),
    ("both result and error", b'{"jsonrpc":"2.0","id":"r","result":{},"error":{"code":1,"message":"m"}}', INVALID_REQUEST, "r"),
    ("a result that is no object", b'{"jsonrpc":"2.0","id":"r","result":5}', INVALID_REQUEST, "r"),
    ("an error without a code", b'{"jsonrpc":"2.0","id":"r","error":{"message":"m"}}', INVALID_REQUEST, "r"),
]  # fmt: skip

# Lines that look odd but are requests: each is served.
SERVED = [
    request(nested(62)),  # 64 deep, the most there may be
    request(b'"\\ud83d\\ude00"'),  # a surrogate pair: one character
    request(b'"\\\\ud800"'),  # an escaped backslash, then letters
    request(json.dumps("[{" * 1000 + "\u2028\x7f").encode()),  # brackets in a string are no nesting
    request(b"[" + b"0," * 99_000 + b"0]"),  # fewer values than the bound
    b'{"jsonrpc":"2.0","id":5,"method":"tools/list","id":true,"id":5}\r',  # the last of a repeated key counts; CRLF
]

# Lines that are messages but ask for no answer: the next line out must be the next request's.
UNANSWERED = [
    b"",
    b" \t\r",
    b'{"jsonrpc":"2.0","method":"notifications/something"}',
    b'{"jsonrpc":"2.0","id":"nobody asked","result":{}}',
    b'{"jsonrpc":"2.0","id":null,"error":{"code":-1,"message":"m"}}',
]


class WireClient(RawClient):
    """:class:`RawClient` that sends bytes as they are and keeps every line it receives as bytes, too."""

    def __init__(self, tmp_path: Path, *, verbose: bool = False, runtime: str | None = None) -> None:
        super().__init__(tmp_path, verbose=verbose, runtime=runtime)
        self.seen: list[bytes] = []

    def send_raw(self, line: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + b"\n")
        self.process.stdin.flush()

    def receive_raw(self) -> bytes:
        line = self._lines.get(timeout=60)
        self.seen.append(line)
        return line

    def receive(self) -> dict[str, Any]:
        return json.loads(self.receive_raw())

    def start(self) -> None:
        self.send(INITIALIZE)
        assert self.receive()["id"] == 1
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def tools_are_listed(self) -> None:
        self.send(LIST)
        answer = self.receive()
        assert answer["id"] == "list" and "execute_javascript" in {tool["name"] for tool in answer["result"]["tools"]}


@pytest.fixture
def connect(tmp_path: Path) -> Iterator[Callable[..., WireClient]]:
    """Start servers for a test; any still running at its end (it failed) get SIGTERM, and SIGKILL if need be."""
    started: list[WireClient] = []

    def start(*, verbose: bool = False, runtime: str | None = None) -> WireClient:
        started.append(WireClient(tmp_path, verbose=verbose, runtime=runtime))
        return started[-1]

    yield start
    for client in started:
        if client.process.poll() is None:
            client.process.terminate()
            try:
                client.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                client.process.kill()
                client.process.wait()


def test_every_line_that_is_no_message_gets_one_error_and_the_server_serves_on(
    connect: Callable[..., WireClient],
) -> None:
    client = connect()
    client.start()
    for name, line, error, request_id in BAD_LINES:
        client.send_raw(line)
        answer = client.receive_raw()
        assert json.loads(answer) == {"jsonrpc": "2.0", "id": request_id, "error": error}, name
        client.tools_are_listed()  # the next line is served, and only it answers
    for line in SERVED:
        client.send_raw(line)
        answer = client.receive()
        assert answer["id"] == 5 and "execute_javascript" in {tool["name"] for tool in answer["result"]["tools"]}
    client.send_raw(b"[" * (64 * 2**20 + 1))  # one byte past the line limit: nothing of it is kept
    assert json.loads(client.receive_raw()) == {"jsonrpc": "2.0", "id": None, "error": PARSE_ERROR}
    for line in UNANSWERED:
        client.send_raw(line)
    client.tools_are_listed()
    stderr = client.finish()
    assert all(SECRET_BYTES not in line for line in client.seen)
    assert SECRET not in stderr and "answered a client line that is not valid UTF-8" in stderr


def test_a_bad_first_line_is_answered_before_initialize_on_either_start_up_path(
    connect: Callable[..., WireClient],
) -> None:
    for recorded in (False, True):  # the SDK answers initialize, then a server that answers it from the record
        client = connect(verbose=True)
        client.send_raw(b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"x":"\xff"}}')
        assert client.receive() == {"jsonrpc": "2.0", "id": None, "error": PARSE_ERROR}
        client.start()
        client.tools_are_listed()
        assert ("initialize answered from the record" in client.finish()) == recorded


ESCAPED = {
    "\x1b": b"\\u001b",
    "\x7f": b"\\u007f",
    "\x85": b"\\u0085",
    "\x9b": b"\\u009b",
    "\u2028": b"\\u2028",
    "\u2029": b"\\u2029",
    "\u202e": b"\\u202e",
    "\u2066": b"\\u2066",
    "\u200b": b"\\u200b",
    "\ufeff": b"\\ufeff",
    "\ue000": b"\\ue000",
    "\U000e0001": b"\\udb40\\udc01",  # a format character beyond the BMP, as a surrogate pair
}
"""Characters a program prints, and what the wire must carry instead of their bytes."""


def test_output_with_line_breaking_and_invisible_characters_comes_back_escaped_on_one_line(
    connect: Callable[..., WireClient],
) -> None:
    text = "start " + "|".join(ESCAPED) + " é中😀 end"
    program = f"process.stdout.write({json.dumps(text)}); console.error({json.dumps(text)});"
    client = connect()
    client.start()
    arguments = {"files": [{"path": "a.js", "content": program}], "entrypoint": "a.js"}
    params = {"name": "execute_javascript", "arguments": arguments}
    client.send({"jsonrpc": "2.0", "id": "run", "method": "tools/call", "params": params})
    line = client.receive_raw()
    client.finish()
    answer = json.loads(line)
    assert answer["id"] == "run" and answer["result"]["structuredContent"]["stdout"] == text
    assert answer["result"]["structuredContent"]["stderr"] == text + "\n"
    assert line.endswith(b"}\n") and line.count(b"\n") == 1 and b"\r" not in line
    for char, escape in ESCAPED.items():
        assert char.encode() not in line, repr(char)
        assert line.count(escape) >= 3, repr(char)  # stdout and stderr, in the structured and the text content
    assert "é中😀".encode() in line  # printable text stays as it is


def test_an_answer_sent_early_from_the_record_is_escaped_too(
    tmp_path: Path, connect: Callable[..., WireClient]
) -> None:
    first, _tools, _stderr = session(tmp_path)
    record = record_of(tmp_path, "protocolVersion")
    instructions = "line one\u2028line two\u202e\x85"
    record.write_text(json.dumps({**first["result"], "instructions": instructions}))
    client = connect(verbose=True)
    client.send(INITIALIZE)
    line = client.receive_raw()
    assert json.loads(line)["result"]["instructions"] == instructions  # the record's, sent before the SDK loaded
    assert b"line one\\u2028line two\\u202e\\u0085" in line and line.count(b"\n") == 1
    client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    client.tools_are_listed()
    assert "initialize answered from the record" in client.finish()
