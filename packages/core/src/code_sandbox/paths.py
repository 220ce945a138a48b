"""The one workspace path validator that every tool uses.

A valid path is relative, POSIX, inside ``/workspace`` and plain: no traversal (plain or percent-encoded, decoded
repeatedly), no absolute, drive, UNC or device form, no alternate data stream, no character of Unicode's
control, format, line or paragraph separator, private-use, surrogate or unassigned categories (controls, bidi and
zero-width marks, and code points that show as nothing, or as whatever a font or a later Unicode makes of them),
no empty, ``.`` or ``..`` component, no leading ``-``, bounded in length and depth.

Unicode rule: paths are normalised to NFC (so a name typed on macOS, often NFD, names the same file as on
Linux) after backslashes become slashes; validation then runs on the normalised form, so it is idempotent.
Errors never echo the path.
"""

from __future__ import annotations

import re
import unicodedata
import urllib.parse

from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.limits import MAX_PATH_BYTES, MAX_PATH_DEPTH

MAX_COMPONENT_BYTES = 255
_MAX_DECODE_ROUNDS = 8

# What each refused category is, in an error's words. A control character can end a line or drive a terminal; a
# format character (bidi marks, zero-width characters) makes a name display as another name; the rest display as
# nothing, or as whatever a font or a later Unicode makes of them.
_REFUSED_CATEGORIES = {
    "Cc": "a control character",
    "Cf": "an invisible or bidirectional control character",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
    "Co": "a private-use character",
    "Cs": "a surrogate",
    "Cn": "an unassigned character",
}
_DRIVE = re.compile(r"^[A-Za-z]:")
# Windows device names are refused as components so a workspace copied to Windows stays usable.
_DEVICE = re.compile(r"^(con|prn|aux|nul|com[0-9¹²³]|lpt[0-9¹²³]|conin\$|conout\$)(\..*)?$", re.IGNORECASE)


def _invalid(message: str) -> SandboxError:
    return SandboxError(ErrorCode.INVALID_PATH, message)


def _traversal() -> SandboxError:
    return SandboxError(ErrorCode.PATH_TRAVERSAL, "the path tries to leave the workspace")


def _is_control(ch: str) -> bool:
    return unicodedata.category(ch) == "Cc"


def _check_characters(path: str) -> None:
    """Refuse a path with a character of a refused category; the error names the category, never the character."""
    if path.isprintable():  # at C speed: no character is in a category of Other or Separator but the space
        return
    for ch in path:
        kind = _REFUSED_CATEGORIES.get(unicodedata.category(ch))
        if kind is not None:
            raise _invalid(f"the path contains {kind}")


def validate_path(raw: str, *, allow_root: bool = False) -> str:
    """Validate and normalise a workspace path.

    :param raw: the path as the client sent it.
    :param allow_root: accept ``.`` (or an empty string) as the workspace root, for listing.
    :return: the normalised relative path (``.`` for the root when allowed).
    :raises SandboxError: ``PATH_TRAVERSAL`` for traversal attempts, ``INVALID_PATH`` for everything else.
    """
    if allow_root and raw in ("", ".", "./"):
        return "."
    path = unicodedata.normalize("NFC", raw.replace("\\", "/"))
    if not path:
        raise _invalid("the path is empty")
    _check_decoded_forms(path)
    _check_characters(path)
    if path.startswith("/"):
        raise _invalid("the path must be relative to the workspace, not absolute, UNC or a device path")
    if _DRIVE.match(path):
        raise _invalid("the path must not start with a drive letter")
    if len(path.encode()) > MAX_PATH_BYTES:
        raise _invalid(f"the path is longer than {MAX_PATH_BYTES} bytes")
    components = path.split("/")
    if len(components) > MAX_PATH_DEPTH:
        raise _invalid(f"the path is deeper than {MAX_PATH_DEPTH} levels")
    for component in components:
        if component == "..":
            raise _traversal()
        if component in ("", "."):
            raise _invalid("the path has an empty or '.' component")
        if len(component.encode()) > MAX_COMPONENT_BYTES:
            raise _invalid(f"a path component is longer than {MAX_COMPONENT_BYTES} bytes")
        if component.startswith("-"):
            raise _invalid("a path component must not start with '-'")
        if ":" in component:
            raise _invalid("the path must not contain ':' (drives and alternate data streams)")
        if _DEVICE.match(component):
            raise _invalid("the path must not name a device")
        if component != component.rstrip(" ") or component.endswith("."):
            raise _invalid("a path component must not end with a space or a dot")
    return path


def _check_decoded_forms(path: str) -> None:
    """Refuse a path whose percent-decoding, applied repeatedly, reveals traversal or a hidden separator."""
    current = path
    for _ in range(_MAX_DECODE_ROUNDS):
        try:
            decoded = urllib.parse.unquote(current, errors="strict") if "%" in current else current
        except UnicodeDecodeError:
            raise _invalid("the path percent-encodes bytes that are not UTF-8") from None
        if decoded == current:
            return
        normalised = decoded.replace("\\", "/")
        if ".." in normalised.split("/"):
            raise _traversal()
        if normalised.startswith("/") or "\x00" in normalised or any(_is_control(ch) for ch in normalised):
            raise _invalid("the path hides a separator or control character in percent-encoding")
        current = decoded
    raise _invalid("the path is percent-encoded too many times")


def validate_entrypoint(raw: str, suffixes: tuple[str, ...]) -> str:
    """Validate an entrypoint: a valid path with one of the profile's suffixes."""
    path = validate_path(raw)
    if not path.endswith(suffixes):
        raise _invalid(f"the entrypoint must end with {', '.join(suffixes)}")
    return path
