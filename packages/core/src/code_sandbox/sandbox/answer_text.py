"""Text that a sandbox produced, made compact for the client's answer and kept within its share of the answer budget.

An answer line is at most :data:`ANSWER_LINE_BYTES` (4 MiB, four times one stream's output cap). Carried naively, a
control byte cost 13 bytes of JSON-RPC (a six-character escape, escaped again in a text block): 2 MiB printed became
a 27.3 MB line. A text that fits its share of the answer is carried exactly as it is. One that does not is made
compact first (each control character as its Unicode control picture, U+2400 block: three bytes that nothing
escapes; a C1 control as U+FFFD) and then, if it still does not fit, cut at a character boundary (the caller marks
it truncated).
"""

from __future__ import annotations

import re

from code_sandbox.limits import MiB

ANSWER_LINE_BYTES = 4 * MiB
"""The most one JSON-RPC answer line may hold (SECURITY.md): four times one stream's output cap."""
STREAM_JSON_BYTES = 3 * MiB // 2
"""One output stream's share, as JSON: both streams and the rest of a run's answer fit in :data:`ANSWER_LINE_BYTES`."""
CONTENT_JSON_BYTES = 3 * MiB
"""A file's content's share (read_file)."""
LISTING_JSON_BYTES = 2 * MiB
"""The paths' share of a listing (list_files)."""

_PICTURES = {
    **{code: 0x2400 + code for code in range(0x20) if code not in (0x09, 0x0A, 0x0D)},
    0x7F: 0x2421,
    **dict.fromkeys(range(0x80, 0xA0), 0xFFFD),
}
_CONTROLS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def readable(text: str) -> str:
    """``text`` with each control character but tab, newline and carriage return shown as its control picture (DEL as
    U+2421) and each C1 control as U+FFFD."""
    return text.translate(_PICTURES) if _CONTROLS.search(text) else text


def readable_output(raw: bytes, share: int = STREAM_JSON_BYTES) -> tuple[str, bool]:
    """A stream's bytes as text (UTF-8, an invalid byte as U+FFFD), made compact (:func:`readable`) and cut only as far
    as it takes to keep its JSON within ``share``; and whether it was cut."""
    return compact(raw.decode("utf-8", "replace"), share)


def compact(text: str, share: int) -> tuple[str, bool]:
    """``text`` as it is if its JSON fits ``share``; else :func:`readable`, cut to fit if need be (:func:`within`)."""
    if fits(text, share):
        return text, False
    return within(readable(text), share)


def fits(text: str, share: int) -> bool:
    return len(text) * 12 <= share or json_cost(text) <= share


def json_cost(text: str) -> int:
    """The bytes ``text`` takes as a JSON string on the wire (quotes aside): its UTF-8, one more for each character
    JSON escapes with a backslash, and a ``\\uXXXX`` (or two) for each the wire escapes (``serve.wire``)."""
    cost = len(text.encode("utf-8", "surrogatepass")) + sum(text.count(char) for char in '"\\\n\r\t')
    if not text.isprintable():
        for char in set(text):
            if not char.isprintable() and char not in "\t\n\r":
                each = 12 if ord(char) > 0xFFFF else 6
                cost += (each - len(char.encode("utf-8", "surrogatepass"))) * text.count(char)
    return cost


def within(text: str, share: int) -> tuple[str, bool]:
    """``text``, or its longest beginning found whose JSON fits ``share``; and whether it was cut."""
    if fits(text, share):
        return text, False
    low, high = 0, len(text)
    while low < high:  # the longest prefix that fits: about 20 measurements of a few MiB at most
        middle = (low + high + 1) // 2
        if json_cost(text[:middle]) <= share:
            low = middle
        else:
            high = middle - 1
    return text[:low], True
