"""What may cross the stdio wire: each client line judged before the MCP SDK sees it, and each line written made
one printable line.

The SDK drops a line it cannot take without a word, so a line that is not one JSON-RPC message is answered here, with
-32700 or -32600 and nothing of the line but its ``id``. Every line written escapes each character that is not
printable, so that it is one line on any terminal and to any JSON reader.
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple

from code_sandbox.jsonvalue import JSONValue, parse_json

MAX_JSON_DEPTH = 64
"""How deeply a client's JSON may nest: no MCP message comes close, and the SDK's parser gives up near 200."""
MAX_JSON_VALUES = 100_000
"""How many values (counted by their brackets and commas) a client's line may hold: a tool call has a few hundred,
and each value is a Python object, so this bounds the memory a 64 MiB line can take as well as its bytes."""
PARSE_ERROR, INVALID_REQUEST = -32700, -32600
_ERROR_MESSAGES = {PARSE_ERROR: "Parse error", INVALID_REQUEST: "Invalid Request"}
_BLANK = b" \t\r"
_FOLD_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE_PAIR = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}")


class Refusal(NamedTuple):
    """The answer to a client line that is no message the SDK will take, and why, in our words, for the log."""

    code: int
    request_id: int | str | None
    reason: str


def judge_line(line: bytes) -> str | Refusal | None:
    """``line`` as text for the SDK if it is one JSON-RPC message that the SDK takes as we do; else the answer it
    gets (``None`` for a blank line, which is no message). Stricter than the SDK, which drops a line it cannot parse
    without a word, takes NaN, and takes a request whose ``id`` has the wrong type for a notification."""
    if not line.strip(_BLANK):
        return None
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return Refusal(PARSE_ERROR, None, "not valid UTF-8")
    if _too_big(line):
        return Refusal(PARSE_ERROR, None, f"JSON nested over {MAX_JSON_DEPTH} deep or over {MAX_JSON_VALUES} values")
    if _holds_lone_surrogate(line):
        return Refusal(PARSE_ERROR, None, "JSON with a lone surrogate")
    try:
        message = parse_json(text)
    except (ValueError, RecursionError):
        return Refusal(PARSE_ERROR, None, "not JSON")
    problem = _envelope_problem(message)
    return text if problem is None else Refusal(INVALID_REQUEST, _usable_id(message), problem)


def _too_big(line: bytes) -> bool:
    """Whether the JSON text ``line`` nests deeper than :data:`MAX_JSON_DEPTH` or holds more than
    :data:`MAX_JSON_VALUES` values, judged before anything is parsed and at C speed, never recursively: without its
    escaped backslashes and quotes, its quotes delimit its strings, and outside them its brackets and commas count.
    Exact on valid JSON; anything else :func:`json.loads` refuses, having built no more than was counted."""
    opens = line.count(b"[") + line.count(b"{")
    if opens <= MAX_JSON_DEPTH and opens + line.count(b",") <= MAX_JSON_VALUES:
        return False  # counted inside strings too: more than there are, so there is nothing to find
    unescaped = line.replace(b"\\\\", b"").replace(b'\\"', b"")
    if unescaped.count(b'"') > 4 * MAX_JSON_VALUES:  # a value is one string at most, and its key another
        return True
    structure = b"".join(unescaped.split(b'"')[::2])
    brackets = structure.translate(_FOLD_BRACKETS, _NOT_BRACKETS)
    if len(brackets) // 2 + structure.count(b",") > MAX_JSON_VALUES:
        return True
    for _ in range(MAX_JSON_DEPTH):  # each pass removes every innermost pair: the depth is the number of passes
        if not brackets:
            return False
        brackets = brackets.replace(b"[]", b"")
    return bool(brackets)


def _holds_lone_surrogate(line: bytes) -> bool:
    """Whether the JSON text ``line`` has a ``\\ud800``-style escape that names no character, even in a value that a
    repeated key replaces: the SDK's parser refuses one anywhere, and Python's takes it. Read on the text, since
    :func:`json.loads` keeps only the last of a repeated key's values."""
    if not _SURROGATE_ESCAPE.search(line):
        return False
    escapes = line.replace(b"\\\\", b"_")  # an escaped backslash: what follows it is no escape, nor joined to one
    return _SURROGATE_ESCAPE.search(_SURROGATE_PAIR.sub(b"", escapes)) is not None


def _envelope_problem(message: JSONValue) -> str | None:
    """What makes ``message`` no JSON-RPC 2.0 request, notification or response as MCP has them; ``None`` if
    nothing does. Extra members are let through, as the SDK ignores them."""
    if not isinstance(message, dict):
        return "JSON but not an object"
    if message.get("jsonrpc") != "2.0":
        return "not JSON-RPC 2.0"
    has_id, usable_id = "id" in message, _usable_id(message) is not None
    if "method" in message:
        if not isinstance(message["method"], str) or not isinstance(message.get("params"), dict | None):
            return "a request or notification with a method or params of the wrong type"
        return None if usable_id or not has_id else "a request with an id of the wrong type"
    if "result" in message and "error" not in message:
        return None if usable_id and isinstance(message["result"], dict) else "a result without an id or an object"
    error = message.get("error")
    if "result" not in message and isinstance(error, dict) and has_id and (usable_id or message["id"] is None):
        code, text = error.get("code"), error.get("message")
        if isinstance(code, int) and not isinstance(code, bool) and isinstance(text, str):
            return None
    return "no request, notification or response"


def _usable_id(message: JSONValue) -> int | str | None:
    """The ``id`` of ``message`` if an answer can carry it: a string or an integer, as MCP requires."""
    request_id = message.get("id") if isinstance(message, dict) else None
    return request_id if isinstance(request_id, int | str) and not isinstance(request_id, bool) else None


def refusal_line(refusal: Refusal) -> str:
    """The JSON-RPC error that answers a refused line; it never carries any of the line but a usable ``id``."""
    error = {"code": refusal.code, "message": _ERROR_MESSAGES[refusal.code]}
    message = {"jsonrpc": "2.0", "id": refusal.request_id, "error": error}
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False) + "\n"


def escape_line(text: str) -> str:
    """One JSON line, with every character that is not printable (``str.isprintable``: Unicode's control, format,
    surrogate, private-use, unassigned and separator characters, the ASCII space aside) written as a ``\\uXXXX``
    escape, so that no terminal acts on one and no reader that takes U+2028 for a line break splits the line. Such
    a character can stand only inside a JSON string, where the escape means the same, or be JSON's own whitespace
    between tokens (tab, CR, LF), where a space does. One scan when there is nothing to escape, else two and a
    translation: tens of milliseconds a megabyte at worst, whatever the text."""
    return escape_text(text.removesuffix("\n")) + "\n"


def escape_text(body: str) -> str:
    """:func:`escape_line` for a piece of a line (no newline of its own): character by character, so a line may be
    escaped in pieces."""
    if body.isprintable():
        return body
    return body.translate({ord(char): _escape(char) for char in set(body) if not char.isprintable()})


def _escape(char: str) -> str:
    if char in "\t\r\n":
        return " "
    code = ord(char)
    if code > 0xFFFF:  # as a UTF-16 surrogate pair, the only way JSON escapes it
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"
