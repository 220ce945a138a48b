"""Telling a picture a client can show from bytes that only start like one.

A sandbox's program decides what a file holds, and a client hands an image block to its model provider or decodes
it itself: a forged header or a decompression bomb there can break the conversation. So a file counts as a
picture only when its structure holds together (checked without a decoder) and its size is modest. Standard
library only.
"""

from __future__ import annotations

import struct
import zlib

MAX_SIDE = 8000
MAX_PIXELS = 40_000_000
MAX_BYTES = 1024 * 1024
"""A larger file is not offered as a picture."""


def whole_picture_type(data: bytes | None, *, truncated: bool) -> str | None:
    """The picture type of a whole file read as bytes (:func:`picture_type`), at most :data:`MAX_BYTES` of it;
    ``None`` for text, a read that was cut, or a larger file."""
    if data is None or truncated or len(data) > MAX_BYTES:
        return None
    return picture_type(data)


def picture_type(data: bytes) -> str | None:
    """``image/png``, ``image/jpeg``, ``image/gif`` or ``image/webp`` for a well-formed file of that kind whose
    sides are at most :data:`MAX_SIDE` pixels and :data:`MAX_PIXELS` in all; ``None`` for anything else."""
    for mime, dimensions in (
        ("image/png", _png),
        ("image/jpeg", _jpeg),
        ("image/gif", _gif),
        ("image/webp", _webp),
    ):
        try:
            size = dimensions(data)
        except (struct.error, IndexError, ValueError):
            size = None
        if size is not None:
            width, height = size
            modest = 0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE and width * height <= MAX_PIXELS
            return mime if modest else None
    return None


def _png(data: bytes) -> tuple[int, int] | None:
    """Every chunk's CRC holds, IHDR (13 bytes) comes first and IEND last."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return None
    position, kinds = 8, list[bytes]()
    while position < len(data):
        (length,) = struct.unpack_from(">I", data, position)
        kind = data[position + 4 : position + 8]
        body = data[position + 8 : position + 8 + length]
        (crc,) = struct.unpack_from(">I", data, position + 8 + length)
        if len(body) != length or crc != zlib.crc32(kind + body):
            return None
        kinds.append(kind)
        position += 12 + length
    if not kinds or kinds[0] != b"IHDR" or kinds[-1] != b"IEND" or struct.unpack_from(">I", data, 8)[0] != 13:
        return None
    return struct.unpack_from(">II", data, 16)


def _jpeg(data: bytes) -> tuple[int, int] | None:
    """Starts with SOI, ends with EOI, and a frame header (SOFn) gives the size."""
    if not (data.startswith(b"\xff\xd8\xff") and data.endswith(b"\xff\xd9")):
        return None
    position = 2
    while position + 4 <= len(data):
        if data[position] != 0xFF:
            return None
        marker = data[position + 1]
        (length,) = struct.unpack_from(">H", data, position + 2)
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack_from(">HH", data, position + 5)
            return width, height
        if marker == 0xDA or length < 2:  # image data before any frame header
            return None
        position += 2 + length
    return None


def _gif(data: bytes) -> tuple[int, int] | None:
    """A GIF87a or GIF89a header and the trailer byte."""
    if not data.startswith((b"GIF87a", b"GIF89a")) or not data.endswith(b";"):
        return None
    return struct.unpack_from("<HH", data, 6)


def _webp(data: bytes) -> tuple[int, int] | None:
    """A RIFF container of exactly this length holding a VP8, VP8L or VP8X first chunk."""
    if not (data.startswith(b"RIFF") and data[8:12] == b"WEBP"):
        return None
    if struct.unpack_from("<I", data, 4)[0] != len(data) - 8:
        return None
    kind = data[12:16]
    if kind == b"VP8X":
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return width, height
    if kind == b"VP8L" and data[20] == 0x2F:
        (bits,) = struct.unpack_from("<I", data, 21)
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if kind == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack_from("<HH", data, 26)
        return width & 0x3FFF, height & 0x3FFF
    return None
