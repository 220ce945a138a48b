"""The ``python-offline`` profile: CPython with its standard library only, no network, no packages.

An example of a third-party profile. It uses only core's profile API (:mod:`code_sandbox.profile`) and protocol
models; its image is built ``FROM scratch`` from the build host's own CPython (the binary, the libraries it and
its extension modules need, and the standard library), and its helpers are Python programs that speak the same
protocol as the JavaScript profile's.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import cast

from code_sandbox.channel.protocol import PROTOCOL_VERSION
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hookspecs import hookimpl
from code_sandbox.profile import HelperFiles, HelperKind, ImageContents, ImageSpec, Profile, ProfileInfo

PROFILE_NAME = "python-offline"
# The version of this image's layout and helpers; bump it when they change.
RUNTIME_VERSION = "1.0.0"
IMAGE_TAG = f"code-sandbox-python:{RUNTIME_VERSION}"
PREFIX = "/usr/local"
PYTHON_PATH = f"{PREFIX}/bin/python3"
HELPERS = HelperFiles(
    package="code_sandbox_python.helpers",
    directory="/opt/sandbox",
    names={"watchdog": "watchdog.py", "files": "files.py", "runner": "runner.py"},
    missing="the in-container helpers are missing from the installed python-offline profile",
    hint="reinstall code-sandbox-python-example",
)
LABEL_PREFIX = "io.code-sandbox."
PYTHON_VERSION_LABEL = LABEL_PREFIX + "python-version"
DEFAULT_PYTHON = Path("/usr/bin/python3")
"""The build host's system CPython. A Python linked against a shared libpython (pyenv, python-build-standalone)
does not start from a copied tree; pass a statically linked one with ``--runtime``."""
# Not copied into the image: tests, GUI and IDE code, installers, third-party package directories, and ctypes,
# which would let a program make any system call the seccomp profile allows and run native code it wrote: the
# JavaScript profile gives programs no such reach either.
EXCLUDED_DIRECTORIES = frozenset(
    {"test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip", "venv", "lib2to3", "site-packages",
     "dist-packages", "__pycache__", "pydoc_data", "ctypes"}
)  # fmt: skip
EXCLUDED_PREFIXES = ("_test", "_ctypes", "xxlimited", "_xxtestfuzz", "config-")

RUN_TOOL_DESCRIPTION = """\
Run a Python file that is already in the sandbox's workspace with CPython 3 and return its result.

Use it after create_sandbox and write_files, as often as you like (fix a file with write_files overwrite=true, \
then run again). For a single throwaway run with no follow-up, use execute_python instead.

The program runs as `python3 -B /workspace/<entrypoint> <arguments...>` with cwd /workspace (so modules next to \
it import), no shell, no network (sockets and DNS fail), the standard library only without ctypes (no pip, no \
packages), \
{memory} of memory, {cpus} and {processes} processes. Files it writes under /workspace persist for later calls; \
/tmp holds {scratch} more, in memory, until the sandbox ends (no file tool sees it). Only one run per sandbox at \
a time.

Returns exit_code, signal, timed_out, oom_killed, stdout and stderr ({output_cap} each at most, with \
stdout_truncated/stderr_truncated set when cut, invalid UTF-8 replaced), termination_reason and duration_ms. \
A program killed by its timeout, its output cap or the memory limit still returns a result; a program that \
cannot be cleaned up destroys the sandbox (error PROCESS_CLEANUP_FAILED), and so does one that stops or kills the \
runner that supervises it (error SUPERVISOR_FAILED)."""

# Printed as one ProbeAnswer line (code_sandbox.channel.protocol) from inside a hardened container, for `doctor`.
PROBE = r"""
import json, re
def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None
def number(text):
    return int(text) if text is not None and text.isdigit() else None
status = read('/proc/self/status') or ''
def field(name):
    match = re.search(rf'^{name}:\s*(\S+)', status, re.M)
    return match.group(1) if match else None
try:
    open('/probe', 'w').close()
    root_writable = True
except OSError as error:
    # gVisor refuses the write for the directory's owner before it looks at the mount: its mount options say it.
    mounts = [line.split(' ') for line in (read('/proc/self/mountinfo') or '').splitlines()]
    root_read_only = any(len(f) > 5 and f[4] == '/' and 'ro' in f[5].split(',') for f in mounts)
    root_writable = error.errno != 30 and not root_read_only  # EROFS
no_new_privs = field('NoNewPrivs')
print(json.dumps({
    'memory_max': number(read('/sys/fs/cgroup/memory.max') or read('/sys/fs/cgroup/memory/memory.limit_in_bytes')),
    'pids_max': number(read('/sys/fs/cgroup/pids.max') or read('/sys/fs/cgroup/pids/pids.max')),
    # from /proc/net/dev: asking the kernel over netlink (socket.if_nameindex) is refused by the seccomp profile
    'interfaces': [line.split(':')[0].strip() for line in (read('/proc/net/dev') or '').splitlines()[2:]
                   if line.strip()],
    'root_writable': root_writable,
    'seccomp': number(field('Seccomp')),
    'no_new_privs': None if no_new_privs is None else no_new_privs == '1',
    'cap_eff': field('CapEff'),
    'apparmor': read('/proc/self/attr/current'),
}))
"""


class PythonProfile(Profile):
    info = ProfileInfo(
        name=PROFILE_NAME,
        language="Python",
        run_tool_name="run_python",
        run_tool_description=RUN_TOOL_DESCRIPTION,
        execute_tool_name="execute_python",
        entrypoint_suffixes=(".py",),
        default_entrypoints=("main.py", "__main__.py"),
        example_path="src/app.py",
        runtime_description="a statically linked Linux CPython 3.11+ binary (its standard library is found beside it)",
        protocol_version=PROTOCOL_VERSION,
        ignored_directories=frozenset({"__pycache__", "venv"}),
    )

    def image_spec(self) -> ImageSpec:
        labels = {
            LABEL_PREFIX + "profile": PROFILE_NAME,
            LABEL_PREFIX + "runtime-version": RUNTIME_VERSION,
            **HELPERS.labels(LABEL_PREFIX),
        }
        return ImageSpec(
            tag=IMAGE_TAG,
            labels=labels,
            helper_digests=HELPERS.digests(),
            runtime_path=PYTHON_PATH,
            runtime_version_label=PYTHON_VERSION_LABEL,
            runtime_version_argv=(PYTHON_PATH, "-I", "-S", "-c", "import platform; print(platform.python_version())"),
            forbidden_names=frozenset({"pip", "pip3", "ensurepip", "easy_install"}),
        )

    def image_contents(self, runtime: Path | None) -> ImageContents:
        binary = (runtime or DEFAULT_PYTHON).resolve()
        layout = _layout(binary)
        files: dict[str, bytes | Path] = {**HELPERS.image_files()}
        image_stdlib = PurePosixPath(PREFIX, "lib", f"python{layout['minor']}")
        sources: dict[str, Path] = {}
        for source in _stdlib_files(Path(layout["stdlib"])):
            sources[str(image_stdlib / source.relative_to(layout["stdlib"]).as_posix())] = source
        files.update(sources)
        files.update(_bytecode(binary, {path: source for path, source in sources.items() if path.endswith(".py")}))
        return ImageContents(
            runtime_source=binary,
            runtime_path=PYTHON_PATH,
            runtime_version=layout["version"],
            files=files,
            reinstall_hint="pass --runtime with a CPython binary whose standard library is installed",
        )

    def build_run_argv(self, entrypoint: str, arguments: Sequence[str]) -> list[str]:
        # -B: no __pycache__ in the workspace (it would count against its limits and show in list_files).
        return [PYTHON_PATH, "-B", f"/workspace/{entrypoint}", *arguments]

    def helper_argv(self, helper: HelperKind) -> list[str]:
        # -I: neither the environment nor /workspace (user code's) is on sys.path, so nothing there can shadow a
        # module a helper imports; -S: no site; -B: nothing written.
        return [PYTHON_PATH, "-I", "-S", "-B", HELPERS.path(helper)]

    def probe_argv(self) -> list[str]:
        return [PYTHON_PATH, "-I", "-S", "-B", "-c", PROBE]


@hookimpl
def code_sandbox_register_profiles(register: Callable[[Profile], None]) -> None:
    register(PythonProfile())


_LAYOUT_SCRIPT = """
import json, platform, sys, sysconfig
print(json.dumps({
    "version": platform.python_version(),
    "minor": "%d.%d" % sys.version_info[:2],
    "implementation": sys.implementation.name,
    "stdlib": sysconfig.get_path("stdlib"),
}))
"""


def _layout(binary: Path) -> dict[str, str]:
    """Ask the interpreter itself where its standard library is; the build host must be able to run it."""
    layout: dict[str, str] = {}
    try:
        completed = subprocess.run(  # noqa: S603 - fixed argv, no shell, empty environment
            [str(binary), "-I", "-S", "-c", _LAYOUT_SCRIPT], capture_output=True, timeout=30, env={}, check=False
        )
        answer: object = json.loads(completed.stdout) if completed.returncode == 0 else None
        if isinstance(answer, dict):
            layout = {str(key): str(value) for key, value in cast(dict[object, object], answer).items()}
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    keys = ("implementation", "version", "minor", "stdlib")
    if (
        not all(key in layout for key in keys)
        or layout["implementation"] != "cpython"
        or not layout["minor"].replace(".", "").isdigit()
        or tuple(int(part) for part in layout["minor"].split(".")) < (3, 11)
        or not Path(layout["stdlib"], "os.py").is_file()
    ):
        raise SandboxError(
            ErrorCode.IMAGE_BUILD_FAILED,
            "the runtime is not a CPython 3.11+ that runs on this host with its standard library installed",
            hint="pass --runtime with such a binary (e.g. /usr/bin/python3)",
        )
    return layout


# Run by the runtime itself, so the bytecode is its own version's. Unchecked-hash pycs are used without looking at
# the source's mtime, which the image build sets to 0 for every file; timestamp pycs would never match.
_COMPILE_SCRIPT = """
import base64, importlib.util, json, marshal, sys
out = {}
for image_path, host_path in json.load(sys.stdin).items():
    with open(host_path, "rb") as f:
        source = f.read()
    try:
        code = compile(source, image_path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        continue  # a file the runtime cannot import anyway (a test fixture, say); it stays source-only
    flags = (1).to_bytes(4, "little")  # hash-based, unchecked
    data = importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(source) + marshal.dumps(code)
    out[importlib.util.cache_from_source(image_path)] = base64.b64encode(data).decode()
json.dump(out, sys.stdout)
"""


def _bytecode(binary: Path, sources: dict[str, Path]) -> dict[str, bytes | Path]:
    """In-image ``__pycache__`` path -> bytecode of every module, compiled by ``binary`` in memory: without it,
    every helper call would compile the standard library modules it imports, a few hundred milliseconds each time."""
    request = json.dumps({path: str(source) for path, source in sources.items()}).encode()
    try:
        completed = subprocess.run(  # noqa: S603 - fixed argv, no shell, empty environment
            [str(binary), "-I", "-S", "-B", "-c", _COMPILE_SCRIPT],
            input=request, capture_output=True, timeout=300, env={}, check=False,
        )  # fmt: skip
        answer: object = json.loads(completed.stdout) if completed.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        answer = None
    if not isinstance(answer, dict):
        raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, "the runtime could not compile its standard library")
    compiled = cast(dict[object, object], answer)
    return {str(path): base64.b64decode(str(data)) for path, data in compiled.items()}


def _stdlib_files(root: Path) -> Iterator[Path]:
    """Every regular file of the standard library worth shipping, sorted; symbolic links are not followed."""
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = sorted(
            name
            for name in subdirectories
            if name not in EXCLUDED_DIRECTORIES and not name.startswith(EXCLUDED_PREFIXES)
        )
        for name in sorted(names):
            path = Path(directory, name)
            if name.endswith((".pyc", ".exe")) or name.startswith(EXCLUDED_PREFIXES) or not path.is_file():
                continue
            if path.is_symlink():
                continue
            yield path
