# Lifetime watchdog of the code-sandbox image: the container's main process (under docker-init). It idles
# until the session's hard lifetime has passed, then exits, so the container stops and Docker removes it
# even when the host process that created it is gone.
#
# Usage: python3 -I -S -B /opt/sandbox/watchdog.py [--lifeline] <lifetime_seconds> [<claimed_lifetime_seconds>]
#        (lifetimes in ASCII digits, 1..86400)
#
# With --lifeline it also exits when its stdin reaches end-of-file: the server holds the container's stdin open
# (the engine closes it when the server's connection goes), so a sandbox whose server is gone ends itself.
#
# With one argument the deadline is fixed. With two, the container waits in a warm pool: it lives
# <lifetime_seconds> unless it is claimed, and the first SIGUSR2 (sent by the host through `docker kill`,
# forwarded by docker-init) moves the deadline to <claimed_lifetime_seconds> from that moment, once. User code
# runs as another uid and cannot send that signal. (SIGUSR2 for every profile: Node.js reserves SIGUSR1 for its
# inspector. The runner's --watchdog-ready looks for it among this process's caught signals.)
# Standard library only, and started with -I: neither /workspace nor the environment can shadow what it imports.
import json
import os
import re
import select
import signal
import sys
import time

MAX_LIFETIME_S = 86_400
# Short wakes notice a wall-clock jump (resume from sleep) within this interval.
CHECK_EVERY_S = 30.0

lifeline = sys.argv[1:2] == ["--lifeline"]
args = sys.argv[2:] if lifeline else sys.argv[1:]


def valid(arg: str) -> bool:
    # fullmatch, not "$": "$" would also accept a trailing newline.
    return re.fullmatch(r"[0-9]{1,5}", arg) is not None and 1 <= int(arg) <= MAX_LIFETIME_S


if not 1 <= len(args) <= 2 or not all(valid(arg) for arg in args):
    refusal = {"ok": False, "code": "INVALID_LIFETIME", "message": "the lifetime must be 1 to 86400 seconds"}
    os.write(2, (json.dumps(refusal, separators=(",", ":")) + "\n").encode())
    os._exit(2)

# Two clocks: the monotonic one cannot be moved by anyone inside the container, and the wall clock keeps
# counting while a laptop (and the Docker Desktop VM) sleeps, when the monotonic clock stands still.
# Whichever says "expired" first wins, so a clock quirk can only shorten the session, never extend it.
monotonic_deadline = 0.0
wall_deadline = 0.0


def set_lifetime(seconds: int) -> None:
    global monotonic_deadline, wall_deadline
    monotonic_deadline = time.monotonic() + seconds
    wall_deadline = time.time() + seconds


set_lifetime(int(args[0]))

# Every caught signal writes a byte to this pipe (set_wakeup_fd), which ends the idle select() at once: a claim
# re-arms the timer at once, as clearTimeout + check() does in the Node.js watchdog. Python's own handlers run
# only between bytecodes of the main thread, so the wait must be one that a signal interrupts.
wake_read, wake_write = os.pipe()
os.set_blocking(wake_read, False)
os.set_blocking(wake_write, False)
signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)

claimable = len(args) == 2


def on_claim(_signum: int, _frame: object) -> None:
    global claimable
    if claimable:  # claimed once; later signals change nothing
        claimable = False
        set_lifetime(int(args[1]))


def leave(_signum: int, _frame: object) -> None:
    os._exit(0)


# docker stop sends SIGTERM (docker-init forwards it): leave at once and cleanly. SIGINT too (Python's default
# would raise KeyboardInterrupt). SIGHUP and SIGPIPE must not end the session early, since nothing here has a
# terminal or a reader: they are ignored (Python already ignores SIGPIPE; Node.js installs no-op handlers).
signal.signal(signal.SIGTERM, leave)
signal.signal(signal.SIGINT, leave)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
signal.signal(signal.SIGPIPE, signal.SIG_IGN)
# Installed last, once everything it needs exists: from this moment the runner's --watchdog-ready sees the SigCgt
# bit, and the host may claim this container. Before it, SIGUSR2's default action would kill us.
signal.signal(signal.SIGUSR2, on_claim)


def check() -> float:
    left = min(monotonic_deadline - time.monotonic(), wall_deadline - time.time())
    if left <= 0:
        os._exit(0)
    return min(left, CHECK_EVERY_S)


def drain() -> None:
    try:
        while os.read(wake_read, 512):
            pass
    except BlockingIOError:
        pass


# One wait at a time keeps the process idle; it wakes every CHECK_EVERY_S at most so that a wall-clock jump is
# noticed within that interval. Calling drain() (a Python function) also runs any pending signal handler before
# check() reads the deadlines.
def _stdin_ended() -> bool:
    """Whether the lifeline reached end-of-file (the server never writes; a wake with nothing to read is not it)."""
    try:
        return not os.read(0, 4096)
    except (BlockingIOError, InterruptedError):
        return False


watched = [wake_read, 0] if lifeline else [wake_read]
while True:
    ready, _, _ = select.select(watched, [], [], check())
    if 0 in ready and _stdin_ended():
        os._exit(0)
    drain()
