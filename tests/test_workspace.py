"""The workspace file tools against a live container."""

from __future__ import annotations

import contextlib
import hashlib

import anyio.to_thread
import pytest
from code_sandbox.channel.protocol import DigestAnswer, DigestRequest, Refusal
from code_sandbox.channel.transport import HelperExecs, Target
from code_sandbox.engine import Engine, ExecRequest
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.limits import MiB
from code_sandbox.paths import validate_path
from code_sandbox.profile import Profile
from code_sandbox.sandbox.sessions import Session, SessionManager
from code_sandbox.sandbox.workspace import delete_files, list_files, read_file, write_files
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.digest import digest_file

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]


@pytest.fixture
async def session(manager: SessionManager) -> Session:
    return await manager.create()


async def _paths(manager: SessionManager, session: Session) -> list[str]:
    entries, _truncated = await list_files(manager, session.id, ".", recursive=True, max_depth=10)
    return [entry.path for entry in entries]


async def test_write_reports_written_exists_and_overwritten(manager: SessionManager, session: Session) -> None:
    files = [("index.js", "console.log(1)"), ("lib/a.js", "export const a = 1;")]
    assert await write_files(manager, session.id, files, overwrite=False) == ["written", "written"]
    again = [("index.js", "changed"), ("lib/b.js", "b")]
    assert await write_files(manager, session.id, again, overwrite=False) == ["exists", "written"]
    assert (await read_file(manager, session.id, "index.js", max_bytes=100)).content == "console.log(1)"
    assert await write_files(manager, session.id, again, overwrite=True) == ["overwritten", "overwritten"]
    assert (await read_file(manager, session.id, "index.js", max_bytes=100)).content == "changed"


async def test_a_write_that_would_reach_101_entries_is_refused_and_the_session_survives(
    manager: SessionManager, session: Session
) -> None:
    await write_files(manager, session.id, [("keep.js", "1")], overwrite=False)
    files = [(f"src/f{i:03}.js", "x") for i in range(99)]  # 99 files + src/ + keep.js = 101 entries
    with pytest.raises(SandboxError) as caught:
        await write_files(manager, session.id, files, overwrite=False)
    assert caught.value.code == ErrorCode.WORKSPACE_LIMIT_EXCEEDED
    assert await _paths(manager, session) == ["keep.js"]
    # Exactly at the limit is fine: 98 files + src/ + keep.js = 100 entries.
    assert await write_files(manager, session.id, files[:98], overwrite=False) == ["written"] * 98
    assert len(await _paths(manager, session)) == 100


async def test_100_files_under_one_directory_in_an_empty_workspace_are_refused_up_front(
    manager: SessionManager, session: Session
) -> None:
    with pytest.raises(SandboxError) as caught:
        await write_files(manager, session.id, [(f"src/{i}.js", "x") for i in range(100)], overwrite=False)
    assert caught.value.code == ErrorCode.WORKSPACE_LIMIT_EXCEEDED
    assert await _paths(manager, session) == []
    assert len(manager) == 1


async def test_size_limits_are_checked_before_anything_is_written(manager: SessionManager, session: Session) -> None:
    with pytest.raises(SandboxError) as too_big:
        await write_files(manager, session.id, [("ok.js", "1"), ("big.txt", "x" * (2 * MiB + 1))], overwrite=False)
    assert too_big.value.code == ErrorCode.FILE_TOO_LARGE
    five = [(f"f{i}.txt", "y" * (2 * MiB)) for i in range(5)]  # 10 MiB in one request
    with pytest.raises(SandboxError) as too_much:
        await write_files(manager, session.id, five, overwrite=False)
    assert too_much.value.code == ErrorCode.FILE_TOO_LARGE
    assert await _paths(manager, session) == []


async def test_the_workspace_byte_limit_counts_existing_files(manager: SessionManager, session: Session) -> None:
    for batch in range(8):  # 8 x 4 x 2 MiB = 64 MiB exactly... minus nothing: the tmpfs is 64 MiB too
        files = [(f"b{batch}/f{i}.txt", "z" * (2 * MiB - 4096)) for i in range(4)]
        await write_files(manager, session.id, files, overwrite=False)
    with pytest.raises(SandboxError) as caught:
        await write_files(manager, session.id, [("last.txt", "z" * (MiB))], overwrite=False)
    assert caught.value.code == ErrorCode.WORKSPACE_LIMIT_EXCEEDED
    assert len(manager) == 1


async def test_read_truncation_never_splits_a_character(manager: SessionManager, session: Session) -> None:
    await write_files(manager, session.id, [("t.txt", "aé😀b")], overwrite=False)  # 1 + 2 + 4 + 1 bytes
    expected = {1: "a", 2: "a", 3: "aé", 4: "aé", 5: "aé", 6: "aé", 7: "aé😀", 8: "aé😀b"}
    for max_bytes, content in expected.items():
        result = await read_file(manager, session.id, "t.txt", max_bytes=max_bytes)
        assert (result.content, result.size, result.truncated) == (content, 8, max_bytes < 8)


async def test_binary_content_is_refused_as_binary_file(manager: SessionManager, session: Session) -> None:
    await anyio.to_thread.run_sync(
        lambda: manager.provisioner.engine.exec(
            session.container_id,
            ExecRequest(
                [
                    "/usr/local/bin/node",
                    "-e",
                    "require('fs').writeFileSync('/workspace/bin.dat', Buffer.from([0xff, 0]))",
                ],
                user=session.user,
                timeout=30,
                max_stdout=1024,
            ),
        )
    )
    with pytest.raises(SandboxError) as caught:
        await read_file(manager, session.id, "bin.dat", max_bytes=100)
    assert caught.value.code == ErrorCode.BINARY_FILE


async def test_list_depth_recursion_and_paths(manager: SessionManager, session: Session) -> None:
    files = [("a.js", "1"), ("d/b.js", "22"), ("d/e/c.js", "333")]
    await write_files(manager, session.id, files, overwrite=False)
    entries, truncated = await list_files(manager, session.id, ".", recursive=True, max_depth=10)
    assert [(e.path, e.type, e.size) for e in entries] == [
        ("a.js", "file", 1),
        ("d", "directory", 0),
        ("d/b.js", "file", 2),
        ("d/e", "directory", 0),
        ("d/e/c.js", "file", 3),
    ]
    assert truncated is False
    shallow, _ = await list_files(manager, session.id, ".", recursive=False, max_depth=10)
    assert [e.path for e in shallow] == ["a.js", "d"]
    sub, _ = await list_files(manager, session.id, "d", recursive=True, max_depth=0)
    assert [e.path for e in sub] == ["d/b.js", "d/e"]
    with pytest.raises(SandboxError) as caught:
        await list_files(manager, session.id, "nope", recursive=True, max_depth=1)
    assert caught.value.code == ErrorCode.NOT_FOUND
    for depth in (-1, 11):
        with pytest.raises(SandboxError) as bad_depth:
            await list_files(manager, session.id, ".", recursive=True, max_depth=depth)
        assert bad_depth.value.code == ErrorCode.INVALID_REQUEST
    for size in (0, 2 * MiB + 1):
        with pytest.raises(SandboxError) as bad_size:
            await read_file(manager, session.id, "a.js", max_bytes=size)
        assert bad_size.value.code == ErrorCode.INVALID_REQUEST


async def test_a_hundred_long_paths_fit_in_one_call(manager: SessionManager, session: Session) -> None:
    # 100 paths of ~1000 bytes of CJK and quotes are far beyond one argv string; requests go over stdin.
    part = "字" * 82  # 246 bytes; four of them and a quoted name make ~1000 bytes per path
    paths = [f'{part}/{part}/{part}/{part}/{i:03}"q".txt' for i in range(100)]
    assert await delete_files(manager, session.id, paths) == ["missing"] * 100


async def test_delete_reports_each_path_and_refuses_directories(manager: SessionManager, session: Session) -> None:
    await write_files(manager, session.id, [("a.js", "1"), ("d/b.js", "2")], overwrite=False)
    assert await delete_files(manager, session.id, ["a.js", "gone.js", "d"]) == ["deleted", "missing", "not_a_file"]
    assert await _paths(manager, session) == ["d", "d/b.js"]
    with pytest.raises(SandboxError) as caught:
        await delete_files(manager, session.id, ["../etc/passwd"])
    assert caught.value.code == ErrorCode.PATH_TRAVERSAL


async def test_a_2_mib_file_of_varied_utf8_round_trips_byte_exactly(manager: SessionManager, session: Session) -> None:
    # One- to four-byte characters, tabs, CRLF, terminal escapes and other control characters, and all of printable
    # ASCII, cut to the last whole character below 2 MiB, into a directory that does not exist yet.
    unit = "ASCII é ü ß Ω 中文 😀🧪 €\t\x01\x07\x1f\x1b[0m\r\n" + "".join(chr(c) for c in range(0x20, 0x7F)) + "\n"
    text = (unit * (2 * MiB // len(unit.encode()) + 1)).encode()[: 2 * MiB].decode("utf-8", "ignore")
    size = len(text.encode())
    assert 2 * MiB - 4 < size <= 2 * MiB
    assert await write_files(manager, session.id, [("deep/dir/u.txt", text)], overwrite=False) == ["written"]
    assert await digest_file(manager, session.id, "deep/dir/u.txt") == hashlib.sha256(text.encode()).hexdigest()
    read = await read_file(manager, session.id, "deep/dir/u.txt", max_bytes=2 * MiB)
    assert (read.content, read.size, read.truncated) == (text, size, False)


async def test_a_symlink_made_by_user_code_destroys_the_session_at_the_next_file_operation(
    manager: SessionManager, session: Session
) -> None:
    await anyio.to_thread.run_sync(
        lambda: manager.provisioner.engine.exec(
            session.container_id,
            ExecRequest(
                ["/usr/local/bin/node", "-e", "require('fs').symlinkSync('/etc', '/workspace/etc')"],
                user=session.user,
                timeout=30,
                max_stdout=1024,
            ),
        )
    )
    with pytest.raises(SandboxError) as caught:
        await list_files(manager, session.id, ".", recursive=True, max_depth=1)
    assert caught.value.code == ErrorCode.WORKSPACE_INTEGRITY
    assert "destroyed" in caught.value.message
    assert manager.provisioner.engine.container_facts(session.container_id) is None
    with pytest.raises(SandboxError) as after:
        await list_files(manager, session.id, ".", recursive=True, max_depth=1)
    assert after.value.code == ErrorCode.INVALID_SESSION


# -- the validator against the helper in a live container --------------------------------------------------------

# Characters of the categories that paths refuse outright (control, format, separators, private-use, surrogates,
# unassigned) are left out: drawn often, they would leave too few accepted paths to compare with the helper.
name = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn")),
    min_size=1,
    max_size=12,
)
candidate = st.lists(name, min_size=1, max_size=4).map("/".join)


def _helper_verdict(engine: Engine, profile: Profile, session: Session, path: str) -> str:
    # Unvalidated on purpose: the helper must refuse what the host's model (and validator) would never send.
    request = DigestRequest.model_construct(path=path)
    target = Target(session.container_id, session.user)
    answer = HelperExecs(engine, profile).call(target, "files", ["digest"], DigestAnswer, request=request, timeout=30)
    return "ok" if not isinstance(answer, Refusal) or answer.code == "NOT_FOUND" else answer.code


async def test_every_path_the_host_accepts_is_created_exactly_there_by_the_helper(
    manager: SessionManager, session: Session
) -> None:
    accepted: list[str] = []

    @settings(
        max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much], deadline=None
    )
    @given(candidate)
    def collect(raw: str) -> None:
        with contextlib.suppress(SandboxError):
            accepted.append(validate_path(raw))

    collect()
    # Keep paths that can coexist as files (none is a directory of another) within the 100-entry limit.
    chosen: list[str] = []
    directories: set[str] = set()
    for path in sorted(set(accepted), key=len):
        parents = {"/".join(path.split("/")[:i]) for i in range(1, path.count("/") + 1)}
        clash = any(p == path or p.startswith(path + "/") or path.startswith(p + "/") for p in chosen) or (
            path in directories or parents & set(chosen)
        )
        if not clash and len(chosen) + 1 + len(directories | parents) <= 100:
            chosen.append(path)
            directories |= parents
    assert len(chosen) >= 20
    await write_files(manager, session.id, [(p, p) for p in chosen], overwrite=False)
    listed = {e.path for e in (await list_files(manager, session.id, ".", recursive=True, max_depth=10))[0]}
    assert set(chosen) <= listed
    for path in chosen[:10]:
        assert (await read_file(manager, session.id, path, max_bytes=4096)).content == path


@pytest.mark.parametrize(
    "raw", ["..", "a/../b", "/etc/passwd", "a//b", "./a", "a/.", "-x", "a\x00b", "a\x1bb", "a\x7fb", ""]
)
async def test_the_helper_refuses_what_the_host_refuses(manager: SessionManager, session: Session, raw: str) -> None:
    with pytest.raises(SandboxError) as host:
        validate_path(raw)
    assert host.value.code in (ErrorCode.INVALID_PATH, ErrorCode.PATH_TRAVERSAL)
    helper = await anyio.to_thread.run_sync(
        _helper_verdict, manager.provisioner.engine, manager.provisioner.profile, session, raw
    )
    assert helper in ("INVALID_PATH", "PATH_TRAVERSAL")
    assert (helper == "PATH_TRAVERSAL") == (host.value.code == ErrorCode.PATH_TRAVERSAL)
