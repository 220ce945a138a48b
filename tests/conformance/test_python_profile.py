"""What only the python-offline example needs checking: the reach Python gives a program, against its own helpers."""

from __future__ import annotations

import errno

import anyio.to_thread
import pytest
from code_sandbox.channel.protocol import RunAnswer, RunRequest
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.limits import MiB
from code_sandbox.profile import Profile
from code_sandbox.sandbox.execution import run_entrypoint
from code_sandbox.sandbox.sessions import SessionManager
from code_sandbox.sandbox.workspace import list_files, write_files

from tests.conformance.conftest import REPOSITORY_PROFILES

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]


@pytest.fixture(scope="session")
def conformance_profile() -> Profile:
    """This module is about python-offline alone."""
    return REPOSITORY_PROFILES["python-offline"]


async def test_a_program_cannot_load_ctypes(sandboxes: SessionManager) -> None:
    # ctypes would give a program any system call the seccomp profile allows (io_uring on some engines) and native
    # code of its own; the image leaves it out, so Python programs have no more reach than JavaScript ones.
    session = await sandboxes.create()
    source = "try:\n    import ctypes\nexcept ImportError as e:\n    print(type(e).__name__)\n"
    await write_files(sandboxes, session.id, [("main.py", source)], overwrite=False)
    result = await run_entrypoint(sandboxes, session.id, "main.py", [], timeout_seconds=10)
    assert (result.exit_code, result.stdout) == (0, "ModuleNotFoundError\n")


KERNEL_REACH = """
import os, socket, struct
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = 'ok'
    except OSError as e:
        out[name] = e.errno
unix = socket.socket(socket.AF_UNIX)
program = struct.pack('HBBI', 6, 0, 0, 0xFFFF)  # one instruction: ret 0xffff
buffer = bytearray(program)
address = id(buffer)  # not a pointer to the bytes: the kernel must refuse before it reads any
attempt('attach_filter', lambda: unix.setsockopt(socket.SOL_SOCKET, 26, struct.pack('HxxxxxxQ', 1, address)))
attempt('sndbuf', lambda: unix.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536))
attempt('inet', lambda: socket.socket(socket.AF_INET))
attempt('netlink', lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
attempt('memfd_exec', lambda: os.close(os.memfd_create('x')))
attempt('memfd_noexec', lambda: os.close(os.memfd_create('x', 8)))  # MFD_NOEXEC_SEAL: mappable as code still
attempt('mqueue', lambda: open('/dev/mqueue/q', 'w').close())
shared = os.open('/etc/passwd', os.O_RDONLY)  # a file of the image, which every sandbox shares
attempt('nowait_read', lambda: os.preadv(shared, [bytearray(1)], 0, os.RWF_NOWAIT))
attempt('dontneed', lambda: os.posix_fadvise(shared, 0, 0, os.POSIX_FADV_DONTNEED))
attempt('plain_read', lambda: os.preadv(shared, [bytearray(1)], 0))
attempt('user_xattr', lambda: os.setxattr('/workspace/main.py', 'user.note', b'x' * 1000))
attempt('acl', lambda: os.setxattr('/tmp', 'system.posix_acl_default', b'\\x02\\x00\\x00\\x00'))
import fcntl
mine = os.open('/tmp/lock', os.O_RDWR | os.O_CREAT)
attempt('record_lock', lambda: fcntl.lockf(mine, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0))
attempt('flock', lambda: fcntl.flock(mine, fcntl.LOCK_EX))
print(out)
"""


@pytest.mark.runc_only(
    "checks our seccomp profile, which gVisor does not apply: its kernel keeps these objects "
    "in its own memory, charged to the sandbox"
)
async def test_a_program_reaches_no_kernel_object_the_cgroup_does_not_count(sandboxes: SessionManager) -> None:
    # Python has setsockopt, memfd_create, preadv2, fadvise, xattrs and locks where JavaScript has none: the seccomp
    # profile refuses the forms that hold memory no cgroup counts (a BPF socket filter, an IP or netlink socket, an
    # extended attribute or ACL on tmpfs, a file lock) or that tell or change what another sandbox has in the page
    # cache; the plain forms work.
    session = await sandboxes.create()
    await write_files(sandboxes, session.id, [("main.py", KERNEL_REACH)], overwrite=False)
    result = await run_entrypoint(sandboxes, session.id, "main.py", [], timeout_seconds=10)
    assert result.exit_code == 0, result.stderr
    eperm = 1
    assert result.stdout.strip() == str({
        "attach_filter": eperm, "sndbuf": "ok", "inet": eperm, "netlink": eperm, "memfd_exec": eperm,
        "memfd_noexec": eperm, "mqueue": 30, "nowait_read": eperm, "dontneed": eperm, "plain_read": "ok",
        "user_xattr": errno.ENOTSUP, "acl": errno.ENOTSUP, "record_lock": errno.ENOLCK, "flock": errno.ENOLCK,
    })  # fmt: skip


STOP_THE_RUNNER = """
import os, signal, time
runner = os.getppid()
if os.fork() == 0:
    os.kill(runner, signal.SIGSTOP)  # same uid: allowed; the runner sleeps through the deadline
    time.sleep(3)
    os.kill(runner, signal.SIGCONT)
    os._exit(0)
time.sleep(2)  # exits after the 1 s deadline, while the runner is stopped
"""


@pytest.mark.runc_only("a runner answer exists only under the sealed-helpers model")
async def test_a_runner_stopped_past_the_deadline_still_reports_a_timeout(sandboxes: SessionManager) -> None:
    # Asked of the runner directly: the host would also call the run a timeout from its duration alone.
    session = await sandboxes.create()
    await write_files(sandboxes, session.id, [("main.py", STOP_THE_RUNNER)], overwrite=False)
    request = RunRequest(
        argv=sandboxes.provisioner.profile.build_run_argv("main.py", []), timeout_ms=1000, stdout_cap=MiB,
        stderr_cap=MiB, stream=False,
    )  # fmt: skip
    async with sandboxes.channel(session.id) as channel:
        answer = await anyio.to_thread.run_sync(lambda: channel.transport.run(channel.target, request, timeout=20))
    assert isinstance(answer, RunAnswer)
    assert answer.timed_out is True and answer.exit_code == 0 and answer.duration_ms >= 2000


async def test_a_fifo_a_program_makes_in_the_workspace_destroys_the_sandbox(sandboxes: SessionManager) -> None:
    # Node has no mkfifo; Python does. The file helper must refuse to work in a workspace that holds one.
    session = await sandboxes.create()
    await write_files(sandboxes, session.id, [("main.py", "import os\nos.mkfifo('pipe')\n")], overwrite=False)
    result = await run_entrypoint(sandboxes, session.id, "main.py", [], timeout_seconds=10)
    assert result.exit_code == 0, result.stderr
    with pytest.raises(SandboxError) as caught:
        await list_files(sandboxes, session.id, ".", recursive=True, max_depth=1)
    assert caught.value.code == ErrorCode.WORKSPACE_INTEGRITY
    assert len(sandboxes) == 0
