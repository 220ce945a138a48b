"""Property tests of the one path validator."""

from __future__ import annotations

import posixpath
import unicodedata
import urllib.parse

import pytest
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.paths import validate_entrypoint, validate_path
from hypothesis import example, given, settings
from hypothesis import strategies as st

# Plain names: letters, digits and a few punctuation marks, never starting with '-' or ending with '.'.
name = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\- ]{0,20}[A-Za-z0-9_]", fullmatch=True).filter(
    lambda n: ".." not in n and ":" not in n
)
valid_path = st.lists(name, min_size=1, max_size=6).map("/".join)
anything = st.text(min_size=0, max_size=60)


def verdict(raw: str) -> str:
    try:
        return validate_path(raw)
    except SandboxError as error:
        return error.code


@settings(max_examples=500)
@given(anything)
@example("a/../../etc/passwd")
@example("%2e%2e/x")
@example("\\\\?\\C:\\x")
def test_every_accepted_path_stays_under_the_workspace(raw: str) -> None:
    try:
        path = validate_path(raw)
    except SandboxError as error:
        assert error.code in (ErrorCode.INVALID_PATH, ErrorCode.PATH_TRAVERSAL)
        return
    resolved = posixpath.normpath(posixpath.join("/workspace", path))
    assert resolved.startswith("/workspace/")
    assert resolved == "/workspace/" + path  # nothing in it resolves differently


@settings(max_examples=500)
@given(st.one_of(anything, valid_path))
def test_validation_is_idempotent(raw: str) -> None:
    first = verdict(raw)
    if first not in (ErrorCode.INVALID_PATH, ErrorCode.PATH_TRAVERSAL):
        assert validate_path(first) == first


@given(valid_path)
def test_plain_relative_paths_are_accepted_unchanged(path: str) -> None:
    assert validate_path(path) == path


def _refused(raw: str, code: ErrorCode) -> None:
    with pytest.raises(SandboxError) as caught:
        validate_path(raw)
    assert caught.value.code == code
    assert len(raw) < 3 or raw not in caught.value.message  # messages never echo the path


@given(valid_path, st.sampled_from(["..", "../..", "%2e%2e", "%2E%2e", "%252e%252e", "%25252e%25252e", ".%2e"]))
def test_traversal_plain_or_percent_encoded_is_refused(prefix: str, dots: str) -> None:
    _refused(f"{prefix}/{dots}/x", ErrorCode.PATH_TRAVERSAL)
    _refused(f"{dots}/{prefix}", ErrorCode.PATH_TRAVERSAL)
    _refused(f"{prefix}\\{dots}\\x", ErrorCode.PATH_TRAVERSAL)


@given(valid_path, st.sampled_from(["/", "\\", "//server/share/", "\\\\server\\share\\", "\\\\.\\", "\\\\?\\"]))
def test_absolute_unc_and_device_prefixes_are_refused(path: str, prefix: str) -> None:
    _refused(prefix + path, ErrorCode.INVALID_PATH)


@given(valid_path, st.sampled_from("ACcZz"))
def test_drive_paths_and_alternate_data_streams_are_refused(path: str, drive: str) -> None:
    _refused(f"{drive}:/{path}", ErrorCode.INVALID_PATH)
    _refused(f"{drive}:{path}", ErrorCode.INVALID_PATH)
    _refused(f"{path}:stream", ErrorCode.INVALID_PATH)
    _refused(f"{path}::$DATA", ErrorCode.INVALID_PATH)


@given(valid_path, st.integers(min_value=0, max_value=0x9F).filter(lambda c: c < 0x20 or c >= 0x7F))
def test_nul_and_control_characters_are_refused(path: str, code: int) -> None:
    _refused(path + chr(code), ErrorCode.INVALID_PATH)
    _refused(path + urllib.parse.quote(chr(code)), ErrorCode.INVALID_PATH)


@given(valid_path, st.sampled_from(["\u202e", "\u2066", "\u200b", "\u200d", "\ufeff", "\u200f", "\u061c"]))
def test_bidi_controls_and_zero_width_characters_are_refused(path: str, mark: str) -> None:
    _refused(mark + path, ErrorCode.INVALID_PATH)
    _refused(path + mark + "x", ErrorCode.INVALID_PATH)


# Characters of each refused category: controls, format characters (bidi, zero-width, invisible operators, tags),
# line and paragraph separators, private use, surrogates and unassigned code points (noncharacters among them).
REFUSED_CHARACTERS = {
    "Cc": "\x00\x1b\x7f\x85\x9b",
    "Cf": "\xad\u061c\u200b\u200e\u202e\u2060\u2064\u2066\ufeff\U0001d173\U000e0001\U000e0041",
    "Zl": "\u2028",
    "Zp": "\u2029",
    "Co": "\ue000\uf8ff\U000f0000\U0010fffd",
    "Cs": "\ud800\udbff\udc00\udfff",
    "Cn": "\u0378\ufdd0\ufffe\uffff\U0001fffe\U00050000\U0010ffff",
}


@pytest.mark.parametrize(("category", "characters"), REFUSED_CHARACTERS.items(), ids=list(REFUSED_CHARACTERS))
def test_every_control_format_separator_private_surrogate_and_unassigned_character_is_refused(
    category: str, characters: str
) -> None:
    for char in characters:
        assert unicodedata.category(char) == category, hex(ord(char))
        for raw in (char + "a.js", "src/a" + char + "b.js", "src/a.js" + char):
            _refused(raw, ErrorCode.INVALID_PATH)
            with pytest.raises(SandboxError) as caught:
                validate_path(raw)
            assert char not in caught.value.message


@given(valid_path, st.characters(categories=["Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn"]), st.integers(0, 60))
def test_a_character_of_a_refused_category_is_refused_wherever_it_stands(path: str, char: str, at: int) -> None:
    _refused(path[:at] + char + path[at:], ErrorCode.INVALID_PATH)


def test_printable_letters_marks_and_spaces_of_any_script_are_still_accepted() -> None:
    for name in (
        "café.js",
        "数据/文件.txt",
        "emoji😀.md",
        "a b.txt",
        "no\u00a0break.txt",
        "ideographic\u3000space.txt",
    ):
        assert validate_path(name) == unicodedata.normalize("NFC", name)


@given(valid_path, st.sampled_from(["", ".", "./"]))
def test_empty_and_dot_components_are_refused(path: str, bad: str) -> None:
    _refused(f"{path}/{bad}/x" if bad else f"{path}//x", ErrorCode.INVALID_PATH)
    _refused(f"./{path}", ErrorCode.INVALID_PATH)
    _refused(f"{path}/", ErrorCode.INVALID_PATH)


def test_length_depth_and_dash_limits() -> None:
    _refused("a" * 256, ErrorCode.INVALID_PATH)
    assert validate_path("a" * 255) == "a" * 255
    _refused("é" * 128, ErrorCode.INVALID_PATH)  # 256 bytes in UTF-8
    _refused("/".join(["a" * 200] * 6), ErrorCode.INVALID_PATH)  # over 1024 bytes
    _refused("/".join(["d"] * 21), ErrorCode.INVALID_PATH)
    assert validate_path("/".join(["d"] * 20)) == "/".join(["d"] * 20)
    _refused("-rf", ErrorCode.INVALID_PATH)
    _refused("a/-b", ErrorCode.INVALID_PATH)
    _refused("", ErrorCode.INVALID_PATH)
    _refused("CON", ErrorCode.INVALID_PATH)
    _refused("src/nul.js", ErrorCode.INVALID_PATH)
    _refused("%ff.js", ErrorCode.INVALID_PATH)


def test_paths_are_normalised_to_nfc_and_backslashes_become_slashes() -> None:
    assert validate_path("cafe\u0301.js") == "caf\u00e9.js"
    assert validate_path("src\\lib\\a.js") == "src/lib/a.js"
    assert validate_path(".", allow_root=True) == "."
    _refused(".", ErrorCode.INVALID_PATH)


def test_entrypoints_need_an_allowed_suffix() -> None:
    suffixes = (".js", ".mjs", ".cjs")
    assert validate_entrypoint("src/main.mjs", suffixes) == "src/main.mjs"
    with pytest.raises(SandboxError) as caught:
        validate_entrypoint("main.ts", suffixes)
    assert caught.value.code == ErrorCode.INVALID_PATH
