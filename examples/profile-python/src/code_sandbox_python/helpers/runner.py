# Runner of the code-sandbox image: runs one user command in its own process group with byte caps on stdout
# and stderr and a timeout, then kills every process the sandbox user has left behind.
# Usage: python3 -I -S -B /opt/sandbox/runner.py
#            <request-json | - | --kill-all | --watchdog-ready | --survey | --channel | --supervise>
# stdout carries exactly one JSON answer line; stderr carries one JSON progress line per second of the run.
# Exit 0 for every well-formed answer (refusals included); a nonzero exit is a bug.
# --channel serves many requests, runs and file operations alike, one after another over a stdin held open for
# the life of the sandbox: one answer line each (see channel below).
#
# User code runs under the runner's own uid, so the runner protects itself the way the kernel allows: python3 is
# installed unreadable (mode 0711), which makes every process that execs it non-dumpable from its first instruction,
# and as a second layer the runner loads the seal (/usr/local/lib/code-sandbox/seal.so, written by core: prctl), so
# user code cannot open our /proc/<pid>/fd or mem, nor ptrace us (gVisor's kernel cannot give this: there the host
# puts CODE_SANDBOX_SEAL=optional in the container's environment); -I keeps /workspace and the environment off
# sys.path, so no user file can shadow a module we import. The runner refuses to run unless it sees that protection in
# force. What user code can still do to us (kill or stop us) only ends the run without an answer, which the host
# treats as a failure and destroys the sandbox.
import base64
import contextlib
import errno
import importlib.util
import json
import math
import os
import re
import resource
import select
import signal
import sys
import time

# Nothing is inherited: the host's environment must never reach user code.
SEAL_PATH = "/usr/local/lib/code-sandbox/seal.so"
CHILD_ENV = {"PATH": "/usr/local/bin", "HOME": "/workspace", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
CLEANUP_GRACE_S = 0.450  # the documented grace: after it, a process still alive means "cleanup failed"
CLEANUP_PAUSE_S = 0.020
DRAIN_S = 0.100
PROGRESS_S = 1.0
MAX_CAP = 64 * 1024 * 1024
MAX_TIMEOUT_MS = 86_400_000
MAX_SAFE_INTEGER = 2**53 - 1
OOM_COUNTERS = ["/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"]  # v2, v1
# The sandbox cgroup's usage counters (v1, then v2), which user code can read but not change: CPU time in
# nanoseconds, memory in bytes now and at its highest since the container started.
CPU_COUNTERS = [
    ("/sys/fs/cgroup/cpuacct/cpuacct.usage", r"^(\d+)$", 1),
    ("/sys/fs/cgroup/cpu.stat", r"^usage_usec (\d+)$", 1000),
]
MEMORY_NOW = [
    ("/sys/fs/cgroup/memory/memory.usage_in_bytes", r"^(\d+)$", 1),
    ("/sys/fs/cgroup/memory.current", r"^(\d+)$", 1),
]
MEMORY_PEAK = [
    ("/sys/fs/cgroup/memory/memory.max_usage_in_bytes", r"^(\d+)$", 1),
    ("/sys/fs/cgroup/memory.peak", r"^(\d+)$", 1),
]
MEMORY_SAMPLE_S = 0.02
READ_BYTES = 64 * 1024

MESSAGES = {
    "INVALID_REQUEST": "the run request is malformed",
    "SPAWN_FAILED": "the command could not be started",
    "RUNNING_AS_ROOT": "the runner refuses to run as root",
    "NOT_SEALED": "the runner refuses to run while other processes of its uid could read its memory",
    "INTERNAL_ERROR": "the runner failed",
}

# The names Node.js gives Linux signals 1..31 in a child's 'exit' event. It has none for the real-time signals
# (32..64): a child they kill is reported as exit code 0 and no signal. Kept identical, so both runners answer alike.
SIGNAL_NAMES = {
    1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 5: "SIGTRAP", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
    9: "SIGKILL", 10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2", 13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM",
    16: "SIGSTKFLT", 17: "SIGCHLD", 18: "SIGCONT", 19: "SIGSTOP", 20: "SIGTSTP", 21: "SIGTTIN", 22: "SIGTTOU",
    23: "SIGURG", 24: "SIGXCPU", 25: "SIGXFSZ", 26: "SIGVTALRM", 27: "SIGPROF", 28: "SIGWINCH", 29: "SIGIO",
    30: "SIGPWR", 31: "SIGSYS",
}  # fmt: skip


def refusal(code):
    return {"ok": False, "code": code, "message": MESSAGES[code]}


def dumps(obj):
    # The bytes JSON.stringify writes: no spaces, non-ASCII as UTF-8, the same escapes.
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def answer(obj, code=0):
    # Written whole before we exit: os.write on the raw fd, no buffer left behind for the interpreter to flush.
    write_all(1, (dumps(obj) + "\n").encode())
    os._exit(code)


def js_round(x):
    return math.floor(x + 0.5)  # Math.round: halves go up (Python's round() goes to even)


def safe_int(value, lo, hi):
    """Number.isSafeInteger(value) && lo <= value <= hi, for JSON parsed the way JavaScript does (numbers are
    doubles: 1.0 and 1e3 are integers, 2**53 is not safe)."""
    if type(value) is not float or not value.is_integer() or abs(value) > MAX_SAFE_INTEGER:
        return None
    number = int(value)
    return number if lo <= number <= hi else None


def reject_constant(_name):
    raise ValueError("not JSON")  # NaN and Infinity are Python extensions; JSON.parse refuses them


def parse_json(text):
    # Every number as a double, as in JavaScript, so the same requests pass and fail.
    return json.loads(text, parse_int=float, parse_constant=reject_constant)


def utf16_length(text):
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def to_bytes(text):
    # Node.js encodes a lone surrogate as U+FFFD; Python's encoder would raise.
    return re.sub("[\ud800-\udfff]", "\ufffd", text).encode()


MAX_REQUEST_BYTES = 4 * 1024 * 1024


def read_stdin(size):
    """Up to ``size`` bytes of stdin, b"" at its end; waits when fd 0 happens to be non-blocking."""
    while True:
        try:
            return os.read(0, size)
        except BlockingIOError:
            select.select([0], [], [])


# Reads one length-prefixed frame from stdin, never waiting for EOF; None when it is cut short or too large.
def read_frame():
    def exactly(size):
        data = bytearray()
        while len(data) < size:
            try:
                chunk = read_stdin(min(size - len(data), READ_BYTES))
            except OSError:
                return None
            if not chunk:
                return None
            data += chunk
        return bytes(data)

    head = exactly(4)
    if head is None:
        return None
    length = int.from_bytes(head, "big")
    if length > MAX_REQUEST_BYTES:
        return None
    body = exactly(length)
    if body is None:
        return None
    try:
        return body.decode("utf-8-sig")  # TextDecoder drops a leading BOM too
    except UnicodeDecodeError:
        return None


def parse_request(text):
    try:
        req = parse_json(text)
    except (ValueError, RecursionError):
        return None
    return check_request(req)


def check_request(req):
    keys = ["argv", "timeout_ms", "stdout_cap", "stderr_cap"]
    # "stream" is optional: when true, kept output is also sent as it arrives (see Capture).
    if type(req) is not dict or not all(k in req for k in keys) or any(k not in keys and k != "stream" for k in req):
        return None
    if "stream" in req and type(req["stream"]) is not bool:
        return None
    argv = req["argv"]
    argv_ok = (
        type(argv) is list
        and 1 <= len(argv) <= 256
        and argv[0] != ""
        and all(type(a) is str and utf16_length(a) <= 65536 and "\0" not in a for a in argv)
    )
    timeout_ms = safe_int(req["timeout_ms"], 1, MAX_TIMEOUT_MS)
    stdout_cap = safe_int(req["stdout_cap"], 0, MAX_CAP)
    stderr_cap = safe_int(req["stderr_cap"], 0, MAX_CAP)
    if not argv_ok or timeout_ms is None or stdout_cap is None or stderr_cap is None:
        return None
    return {
        "argv": [to_bytes(a) for a in argv],
        "timeout_ms": timeout_ms,
        "stdout_cap": stdout_cap,
        "stderr_cap": stderr_cap,
        "stream": req.get("stream") is True,
    }


# The first of `counters` this cgroup layout has, scaled; None when none can be read.
def read_counter(counters):
    for path, pattern, scale in counters:
        try:
            with open(path, encoding="latin-1") as file:
                match = re.search(pattern, file.read().strip(), re.M | re.A)
        except OSError:
            continue  # not this layout
        if match:
            return int(match.group(1)) * scale
    return None


# The cgroup's OOM-kill counter, or None when this kernel/cgroup layout does not expose one.
def read_oom_kills():
    for path in OOM_COUNTERS:
        try:
            with open(path, encoding="latin-1") as file:
                match = re.search(r"^oom_kill (\d+)$", file.read(), re.M | re.A)
        except OSError:
            continue  # try the other cgroup version
        if match:
            return int(match.group(1))
    return None


def proc_pids():
    return [name for name in os.listdir("/proc") if re.fullmatch(r"[0-9]+", name, re.A)]


def read_status(pid):
    with open(f"/proc/{pid}/status", encoding="latin-1") as file:
        return file.read()


def status_field(status, name, pattern):
    """The one value of a status field, or None unless it is there exactly once: the first line is the process's
    name, which gVisor's kernel does not escape, so a name holding a newline could put a line of its own above the
    real ones. A field seen twice is not believed."""
    found = re.findall(rf"^{name}:\s+({pattern})", status, re.M | re.A)
    return found[0] if len(found) == 1 else None


def status_uid_and_state(status):
    uid = status_field(status, "Uid", r"\d+")
    state = status_field(status, "State", r"\S")
    return (int(uid) if uid is not None else None), state


# Live processes with our real uid, except ourselves. Zombies are already dead; init reaps them.
def same_uid_pids():
    uid = os.getuid()
    me = os.getpid()
    pids = []
    for name in proc_pids():
        if int(name) == me:
            continue
        try:
            status = read_status(name)
        except OSError:
            continue  # exited while we scanned
        their_uid, state = status_uid_and_state(status)
        if their_uid == uid and state not in ("Z", "X"):
            pids.append(int(name))
    return pids


# kill(-1) signals every process we may signal (all of our uid; never init, never the caller) in one step that
# a concurrent fork cannot escape.
def signal_all(signum):
    with contextlib.suppress(OSError):  # ESRCH: nobody else is there
        os.kill(-1, signum)


# Kills every other process of the sandbox user and proves it with /proc scans. Everyone is stopped first: a
# stopped process can neither fork nor compete for the CPU, so the count stays exact and the scan quick even
# right after a fork storm. Then they are killed, and we wait (re-killing anything seen) until a scan is clean.
# ``pause`` waits between scans; during a run it keeps reading the program's pipes meanwhile.
def kill_leftovers(pause=time.sleep):
    signal_all(signal.SIGSTOP)
    seen = set(same_uid_pids())
    signal_all(signal.SIGKILL)
    deadline = time.monotonic() + CLEANUP_GRACE_S
    while True:
        alive = same_uid_pids()
        if not alive:
            return "ok", len(seen)
        if time.monotonic() >= deadline:
            return "failed", len(seen)
        for pid in alive:
            seen.add(pid)
            with contextlib.suppress(OSError):  # already gone
                os.kill(pid, signal.SIGKILL)
        pause(CLEANUP_PAUSE_S)


# Counts every byte but keeps only `cap`; crossing the cap calls on_overflow once. We keep reading (and
# discarding) until the kill lands, so a flooding child can never stall the runner or fill the pipe. With
# `name` set, kept output is also written to our stderr as {"stream": name, "b64": ...}, coalesced to one line per
# STREAM_FLUSH_S (or per STREAM_PIECE_BYTES), so the host can show output while the program runs at a cost that
# does not grow with the number of writes; the final answer still carries all of it.
STREAM_FLUSH_S = 0.250
STREAM_PIECE_BYTES = 64 * 1024


class Capture:
    def __init__(self, fd, cap, on_overflow, name):
        self.fd = fd  # None once the pipe is closed
        self.cap = cap
        self.on_overflow = on_overflow
        self.name = name
        self.chunks = []
        self.kept = 0
        self.total = 0
        self.truncated = False
        self.pending = []
        self.pending_bytes = 0
        self.flush_at = None  # the coalescing timer, when armed

    def take(self, chunk):
        self.total += len(chunk)
        if self.kept < self.cap:
            part = chunk[: self.cap - self.kept]
            self.chunks.append(part)
            self.kept += len(part)
            if self.name:
                self.pending.append(part)
                self.pending_bytes += len(part)
                if self.pending_bytes >= STREAM_PIECE_BYTES:
                    self.flush()
                elif self.flush_at is None:
                    self.flush_at = time.monotonic() + STREAM_FLUSH_S
        if self.total > self.cap and not self.truncated:
            self.truncated = True
            self.on_overflow()

    def flush(self):
        self.flush_at = None
        if self.pending_bytes == 0:
            return
        b64 = base64.b64encode(b"".join(self.pending)).decode()
        self.pending = []
        self.pending_bytes = 0
        write_all(2, (dumps({"stream": self.name, "b64": b64}) + "\n").encode())

    def read(self):
        try:
            chunk = os.read(self.fd, READ_BYTES)
        except OSError:
            chunk = b""  # a broken pipe only ends the capture
        if chunk:
            self.take(chunk)
        else:
            self.close()

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Wakeup:
    """A pipe that SIGCHLD writes to (set_wakeup_fd), so that one select() waits for output, timers and the
    child's exit alike. Python runs its own signal handlers only between bytecodes of the main thread; this fd is
    what makes a blocked select() notice the exit at once."""

    def __init__(self):
        self.read_fd, write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)

    def drain(self):
        try:
            while os.read(self.read_fd, 512):
                pass
        except BlockingIOError:
            pass


def pump(captures, wakeup, until):
    """Read whatever output arrives and fire due flush timers, until a signal, output, or the `until` time."""
    fds = [c.fd for c in captures if c.fd is not None]
    timers = [c.flush_at for c in captures if c.flush_at is not None]
    wait = max(0.0, min([until, *timers]) - time.monotonic())
    readable, _, _ = select.select([wakeup.read_fd, *fds], [], [], wait)
    for capture in captures:
        if capture.fd is not None and capture.fd in readable:
            capture.read()
    wakeup.drain()
    now = time.monotonic()
    for capture in captures:
        if capture.flush_at is not None and now >= capture.flush_at:
            capture.flush()


def exit_status(returncode):
    """(exit_code, signal) as Node.js's 'exit' event reports them."""
    if returncode >= 0:
        return returncode, None
    name = SIGNAL_NAMES.get(-returncode)
    return (None, name) if name else (0, None)


def run(req, wakeup):
    # Imported here, not above: it is by far our heaviest import, and only a run needs it (--survey, --kill-all
    # and --watchdog-ready answer sooner without it). -I keeps /workspace off sys.path, so it cannot be shadowed.
    import subprocess

    oom_before = read_oom_kills()
    cpu_before = read_counter(CPU_COUNTERS)
    peak_before = read_counter(MEMORY_PEAK)
    memory_before = read_counter(MEMORY_NOW)
    sampled_peak = memory_before
    started = time.monotonic()
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        # start_new_session: the child leads a new process group (and session), so one kill reaches its whole
        # group and never the runner. close_fds (the default) leaves it nothing but the three standard fds, and
        # restore_signals (the default) puts back SIGPIPE and SIGXFSZ, which Python ignores; every other signal
        # is already at its default here (see main), and caught ones are reset by execve.
        child = subprocess.Popen(
            req["argv"],
            cwd="/workspace",
            env=CHILD_ENV,
            stdin=subprocess.DEVNULL,
            stdout=out_write,
            stderr=err_write,
            start_new_session=True,
        )
    except (OSError, ValueError, subprocess.SubprocessError):
        os.close(out_read)
        os.close(err_read)
        return refusal("SPAWN_FAILED")
    finally:
        os.close(out_write)
        os.close(err_write)

    def kill_group():
        with contextlib.suppress(OSError):  # the group is already empty
            os.kill(-child.pid, signal.SIGKILL)

    out = Capture(out_read, req["stdout_cap"], kill_group, "stdout" if req["stream"] else None)
    err = Capture(err_read, req["stderr_cap"], kill_group, "stderr" if req["stream"] else None)
    captures = [out, err]
    timed_out = False
    deadline = started + req["timeout_ms"] / 1000
    next_progress = started + PROGRESS_S
    next_sample = started + MEMORY_SAMPLE_S

    # Wait for the child's exit, not for its pipes: a grandchild that escaped the group may hold them open forever.
    # SIGCHLD wakes the wait; poll() (waitpid with WNOHANG) is asked on every turn, so no exit can be missed.
    while child.poll() is None:
        now = time.monotonic()
        if not timed_out and now >= deadline:
            timed_out = True
            kill_group()
        if now >= next_progress:
            line = {"elapsed_ms": js_round((now - started) * 1000), "stdout_bytes": out.total}
            write_all(2, (dumps({**line, "stderr_bytes": err.total}) + "\n").encode())
            next_progress = now + PROGRESS_S  # as setInterval: the next one a full period after this one
        if now >= next_sample:
            memory_now = read_counter(MEMORY_NOW)
            if memory_now is not None and sampled_peak is not None:
                sampled_peak = max(sampled_peak, memory_now)
            next_sample = now + MEMORY_SAMPLE_S
        pump(captures, wakeup, min(next_progress, next_sample, math.inf if timed_out else deadline))
    ended = time.monotonic()
    # An exit seen only after the deadline is a timeout: user code can stop or starve this process (same uid) so
    # that the loop above never runs between the deadline and the exit.
    timed_out = timed_out or ended >= deadline
    duration_ms = js_round((ended - started) * 1000)
    code, signal_name = exit_status(child.returncode)

    cleanup, killed = kill_leftovers(lambda seconds: pump_for(captures, wakeup, seconds))
    cpu_after = read_counter(CPU_COUNTERS)
    peak_after = read_counter(MEMORY_PEAK)
    # Every writer is dead now, so what is still buffered in the pipes arrives at once; bound the wait anyway.
    drain_until = time.monotonic() + DRAIN_S
    while any(c.fd is not None for c in captures) and time.monotonic() < drain_until:
        pump(captures, wakeup, drain_until)
    out.close()
    err.close()
    out.flush()
    err.flush()
    oom_after = read_oom_kills()
    oom_detectable = oom_before is not None and oom_after is not None
    return {
        "ok": True,
        "exit_code": code,
        "signal": signal_name,
        "timed_out": timed_out,
        "stdout_b64": base64.b64encode(b"".join(out.chunks)).decode(),
        "stderr_b64": base64.b64encode(b"".join(err.chunks)).decode(),
        "stdout_bytes": out.total,
        "stderr_bytes": err.total,
        "stdout_truncated": out.truncated,
        "stderr_truncated": err.truncated,
        # Only the kernel's counter says "OOM": a SIGKILL alone could be ours or anyone's.
        "oom_killed": oom_detectable and oom_after > oom_before and signal_name == "SIGKILL",
        "oom_detectable": oom_detectable,
        "duration_ms": duration_ms,
        "cleanup": cleanup,
        "leftover_killed": killed,
        # The cgroup's CPU time from before the spawn to after the cleanup: the program, its children, and the
        # little that the runner and the idle watchdog used meanwhile.
        "cpu_ms": None if cpu_before is None or cpu_after is None else js_round(max(0, cpu_after - cpu_before) / 1e6),
        # The most the cgroup used during the run above what it used just before (the helpers' own memory): a new
        # high-water mark set during the run is exact; otherwise the highest sample (every 20 ms) is as near as it
        # gets.
        "peak_memory_bytes": None
        if memory_before is None
        else max(
            0,
            (
                peak_after
                if peak_before is not None and peak_after is not None and peak_after > peak_before
                else sampled_peak
            )
            - memory_before,
        ),
    }


def pump_for(captures, wakeup, seconds):
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        pump(captures, wakeup, until)


# Load the seal: its initialiser runs prctl(PR_SET_DUMPABLE, 0). It defines no module, so the import fails after
# loading it, which says nothing about the seal: sealed() does.
def seal():
    try:
        spec = importlib.util.spec_from_file_location("seal", SEAL_PATH)
        if spec is not None:
            importlib.util.module_from_spec(spec)
    except ImportError:
        pass


# Whether this process is non-dumpable: the kernel then makes its /proc/<pid>/fd directory root's, and only such a
# process is out of reach of user code under the same uid.
def sealed():
    try:
        return os.stat(f"/proc/{os.getpid()}/fd").st_uid == 0
    except OSError:
        return False


# Live processes of every unprivileged uid but ours (we run as the supervisor here, which user code cannot signal
# or read): after a run, any such process outlived it. A status that cannot be read counts as alive; a process that
# vanished between listing and reading means the process table changed under us, so we look again, and a table
# that keeps changing (something still forks and exits) counts as alive too.
# `spared` is the pid of the session's channel (a runner of the sandbox uid that lives on between runs), which the
# host learned from the channel itself when it opened it; it is the one process not counted.
SURVEY_SCANS = 5


def survey(spared):
    own = os.getuid()
    me = os.getpid()
    for _scan in range(SURVEY_SCANS):
        alive = 0
        vanished = 0
        for name in proc_pids():
            if int(name) in (me, spared):
                continue
            try:
                status = read_status(name)
            except OSError as error:
                if error.errno in (errno.ENOENT, errno.ESRCH):
                    vanished += 1
                else:
                    alive += 1
                continue
            uid, state = status_uid_and_state(status)
            if uid != 0 and uid != own and state not in ("Z", "X"):
                alive += 1
        if alive > 0 or vanished == 0:
            return alive
    return 1


# Waits for one line on stdin, which releases the survey: empty, or the pid to spare (the channel's). Returns
# {"spared": pid or None}, or None when stdin ends first (the survey is not wanted) or the line is malformed.
# One byte at a time: the line is short, and nothing after it is ours to read.
SURVEY_LINE_BYTES = 16


released_at_end = False  # set when released() found stdin at its end before a byte of a line


def released():
    global released_at_end
    line = b""
    while True:
        try:
            byte = read_stdin(1)
        except OSError:
            return None
        if not byte:
            released_at_end = line == b""
            return None
        if byte == b"\n":
            break
        line += byte
        if len(line) > SURVEY_LINE_BYTES:
            return None
    if line == b"":
        return {"spared": None}
    return {"spared": int(line)} if re.fullmatch(rb"[1-9][0-9]{0,9}", line) else None


# Whether the watchdog (another uid's process, under init) has installed its SIGUSR2 handler: a warm container
# is claimed with SIGUSR2, whose default action would kill a watchdog that has not finished starting (and a
# Python watchdog takes a while to start).
def watchdog_ready():
    for pid in proc_pids():
        if pid == "1":
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                if b"watchdog.py" not in file.read():
                    continue
            caught = re.search(r"SigCgt:\s*([0-9a-f]+)", read_status(pid), re.A)
            return caught is not None and (int(caught.group(1), 16) >> 11) & 1 == 1  # bit 11: signal 12, SIGUSR2
        except OSError:
            pass  # the process went away while we looked
    return False


def normalize_signals():
    """Leave the runner, and so the child it forks, with Node.js's dispositions: all signals unblocked and at
    their defaults, except SIGPIPE, which stays ignored here (a closed pipe is an error, not our death) and which
    Popen's restore_signals sets back to the default in the child. SIGINT goes back to its default too: Python's
    KeyboardInterrupt would turn it into an INTERNAL_ERROR answer instead of ending us, as it ends Node.js."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP, signal.SIGPIPE):
            continue
        try:
            if signum == signal.SIGINT or signal.getsignal(signum) == signal.SIG_IGN:
                signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # signals the C library reserves for itself


# The file helper, loaded by its absolute path beside ours: -I keeps its directory off sys.path, and that directory
# is root's (0755, files 0555), so nothing user code wrote can stand in for it.
def load_file_helper():
    from importlib import util

    spec = util.spec_from_file_location(
        "code_sandbox_files", os.path.join(os.path.dirname(os.path.abspath(__file__)), "files.py")
    )
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHANNEL_OPS = ("write", "list", "read", "delete", "digest", "inventory", "unpack", "run", "execute")
# Written on stderr after every stderr line of a request and before its answer: stderr and stdout reach the host by
# separate copies and may arrive out of order, so this tells it that nothing of the request is still on its way.
STDERR_END = b'{"end":true}\n'


# What a program could change about us from outside: resource limits, scheduling (priority, nice, real-time
# priority, policy) and allowed CPUs. None when it cannot be read.
def own_state():
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read().decode("latin-1")
        fields = stat[stat.rindex(")") + 2 :].split(" ")
        with open("/proc/self/status", "rb") as f:
            cpus = re.search(r"^Cpus_allowed_list:\s*(\S+)", f.read().decode("latin-1"), re.M)
        try:
            with open("/proc/self/limits", "rb") as f:
                limits = f.read().decode("latin-1")
        except FileNotFoundError:  # gVisor's /proc has no limits file: ask the kernel for each limit instead
            limits = repr(
                [
                    resource.getrlimit(getattr(resource, name))
                    for name in sorted(dir(resource))
                    if name.startswith("RLIMIT_")
                ]
            )
        return "|".join([limits, fields[15], fields[16], fields[37], fields[38], cpus.group(1) if cpus else ""])
    except (OSError, ValueError, IndexError):
        return None


def send(obj):
    write_all(1, (dumps(obj) + "\n").encode())


# Protocol version 3: the channel first says hello ({"ok": true, "pid": ...}); then requests arrive one at a time
# as frames on a stdin that stays open, each an envelope {"op": ..., "request": ...}; a write's (and an execute's)
# header frame and bytes follow its envelope, as for `files.py write -`.
# Each gets exactly the answer line its exec form gives. One reader serves the frames and the payloads and never
# reads ahead (files.take), so nothing is lost between requests. The end of stdin at a frame boundary ends the
# channel quietly; anything that leaves no trustworthy next frame (a frame cut short or too large, not UTF-8 or
# not JSON, a bad envelope, a write whose payload was not read whole) is answered, if at all, and ends it with
# exit 0; after INTERNAL_ERROR we exit 1. Programs run exactly as in the exec form, and the cleanup after each run
# kills every process of our uid but us.
# A one-shot's single request: {"write": <a write request>, "run": <a run request>}, the write's header and bytes
# after the frame. The program runs only once every file is written; the answer carries both results, or the first
# refusal (after which the channel ends).
def execute(files, request, take, wakeup):
    if type(request) is not dict or sorted(request) != ["run", "write"]:
        return refusal("INVALID_REQUEST")
    req = check_request(request["run"])
    if req is None:
        return refusal("INVALID_REQUEST")
    written = files.file_operation("write", request["write"], take)
    if written["ok"] is not True:
        return written
    ran = run(req, wakeup)
    return ran if ran["ok"] is not True else {"ok": True, "written": written, "run": ran}


def channel():
    files = load_file_helper()
    import subprocess  # noqa: F401  # run()'s heaviest import, paid now while the host waits for the hello

    take = files.take
    wakeup = None  # one SIGCHLD pipe for every run: set_wakeup_fd keeps only one
    # The first line names this process, so that the supervisor's survey can spare it (and only it) after a run.
    send({"ok": True, "pid": os.getpid()})
    initial = own_state()
    while True:
        head = []
        if not take(4, head.append):
            if not head:
                os._exit(0)  # the host closed stdin between requests
            answer(refusal("INVALID_REQUEST"))
        length = int.from_bytes(b"".join(head), "big")
        body = []
        if length > MAX_REQUEST_BYTES or not take(length, body.append):
            answer(refusal("INVALID_REQUEST"))
        try:
            envelope = parse_json(b"".join(body).decode("utf-8-sig"))  # TextDecoder drops a leading BOM too
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            answer(refusal("INVALID_REQUEST"))
        if (
            type(envelope) is not dict
            or len(envelope) != 2
            or "request" not in envelope
            or envelope.get("op") not in CHANNEL_OPS
        ):
            answer(refusal("INVALID_REQUEST"))
        # A program may lower our limits, priority or CPUs (prlimit, setpriority: the kernel checks only the uid),
        # and every later program would inherit them: a channel whose state changed answers this request (never out
        # of turn) with a failure and ends, and the host destroys the sandbox.
        if initial is None or own_state() != initial:
            answer(refusal("INTERNAL_ERROR"), 1)
        op, request = envelope["op"], envelope["request"]
        if op == "execute":
            if wakeup is None:
                wakeup = Wakeup()
            result = execute(files, request, take, wakeup)
            if result.get("code") == "INTERNAL_ERROR":
                answer(result, 1)
            write_all(2, STDERR_END)
            send(result)
            if result["ok"] is not True:
                os._exit(0)  # the host discards a one-shot sandbox whatever went wrong; its payload may be unread
            continue
        if op == "run":
            req = check_request(request)
            if req is None:
                write_all(2, STDERR_END)
                send(refusal("INVALID_REQUEST"))
                continue
            if wakeup is None:
                wakeup = Wakeup()  # before the first child, so its exit cannot be missed
            result = run(req, wakeup)  # an exception here is answered INTERNAL_ERROR below main
            write_all(2, STDERR_END)
            send(result)
            continue
        result = files.file_operation(op, request, take)
        if result.get("code") == "INTERNAL_ERROR":
            answer(result, 1)
        if files.payload_pending:
            answer(result)
        write_all(2, STDERR_END)
        send(result)


# The supervisor's channel (--supervise, run as the supervisor uid): a survey per line on a held stdin, each line as
# for --survey, one answer line each, so a run's proof of cleanup costs no docker exec. Ends with stdin; a malformed
# line is answered once and ends it.
def supervise():
    while True:
        release = released()
        if release is None:
            if released_at_end:
                os._exit(0)
            answer(refusal("INVALID_REQUEST"))
        send({"ok": True, "alive": survey(release["spared"])})


def main():
    # Arguments as Node.js sees them: undecodable bytes become U+FFFD rather than surrogate escapes.
    args = [os.fsencode(arg).decode("utf-8", "replace") for arg in sys.argv[1:]]
    normalize_signals()
    # As root, kill(-1) and the uid scan would reach every process in sight (on a host: the whole machine).
    if os.getuid() == 0:
        return refusal("RUNNING_AS_ROOT")
    seal()
    if not sealed() and os.environ.get("CODE_SANDBOX_SEAL") != "optional":
        return refusal("NOT_SEALED")
    # One survey: it waits for one line on stdin (what to spare, as for --supervise), then counts.
    if len(args) == 1 and args[0] == "--survey":
        release = released()
        return refusal("INVALID_REQUEST") if release is None else {"ok": True, "alive": survey(release["spared"])}
    if len(args) == 1 and args[0] == "--watchdog-ready":
        return {"ok": True, "ready": watchdog_ready()}
    if len(args) == 1 and args[0] == "--kill-all":
        cleanup, killed = kill_leftovers()
        return {"ok": True, "killed": killed, "cleanup": cleanup}
    if len(args) == 1 and args[0] == "--channel":
        channel()  # never returns: it exits when the channel ends
    if len(args) == 1 and args[0] == "--supervise":
        supervise()  # never returns: it exits when stdin ends
    if len(args) != 1:
        return refusal("INVALID_REQUEST")
    # "-": the request is one frame on stdin (4-byte big-endian length, then JSON), which has no argv size limit;
    # the kernel caps a single argv string at 128 KiB, less than 32 arguments of 4 KiB in JSON.
    text = read_frame() if args[0] == "-" else args[0]
    req = None if text is None else parse_request(text)
    # The SIGCHLD wakeup exists before the child does, so its exit cannot be missed.
    return refusal("INVALID_REQUEST") if req is None else run(req, Wakeup())


if __name__ == "__main__":
    try:
        result = main()
    except BaseException:  # anything at all: one well-formed line, then a nonzero exit
        answer(refusal("INTERNAL_ERROR"), 1)
    answer(result)
