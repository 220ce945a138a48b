"""Server liveness markers: each server holds a lock on its own marker file for as long as it runs.

The kernel drops the lock when the process dies, however it dies, so a sweep can tell a stopped server's orphaned
containers from a live peer's. A marker that cannot be read says nothing: liveness is then unknown, never "dead".
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import socket
import stat
import sys
from collections.abc import Collection
from pathlib import Path

if sys.platform != "win32":
    import fcntl

logger = logging.getLogger(__name__)

SERVERS_DIR = "servers"
_OWNER = re.compile(r"[0-9a-f]{16}")
_MARKER_NAME = re.compile(r"([0-9a-f]{16})\.lock")
_ACQUIRE_ATTEMPTS = 3


def machine_name() -> str:
    """This machine's host name as a server's containers record it: letters, digits, '.' and '-' only, at most 63."""
    return re.sub(r"[^A-Za-z0-9.-]", "", socket.gethostname())[:63] or "unknown"


def default_state_dir() -> Path:
    """``%LOCALAPPDATA%\\code-sandbox`` on Windows, else ``$XDG_STATE_HOME/code-sandbox`` or ``~/.local/state/...``."""
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        state = os.environ.get("XDG_STATE_HOME")
        base = Path(state) if state and os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "code-sandbox"


class ServerMarker:
    """This server's owner token and, when it could be recorded, the locked marker file that proves it is alive."""

    def __init__(self, owner: str, path: Path | None, fd: int | None) -> None:
        self.owner = owner
        self.path = path
        self._fd = fd

    @classmethod
    def acquire(cls, state_dir: Path) -> ServerMarker:
        """Generate an owner token and record it as ``<state_dir>/servers/<owner>.lock``, locked until release.

        Never raises: when the state directory is unusable (or on Windows) the marker has a token but no file.
        """
        if sys.platform == "win32":
            logger.debug("server liveness is not recorded: no flock on this platform")
            return cls(secrets.token_hex(8), None, None)
        try:
            servers = _servers_dir(state_dir, create=True)
            if servers is None:
                raise PermissionError("the servers directory is not private to this user")
            for _ in range(_ACQUIRE_ATTEMPTS):
                owner = secrets.token_hex(8)
                path = servers / f"{owner}.lock"
                flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                try:
                    fd = os.open(path, flags, 0o600)
                except FileExistsError:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # a peer's prune is judging our new file this instant: use another name
                    os.close(fd)
                    continue
                except OSError:  # no locks on this filesystem (ENOLCK): a file without a lock would read "stopped"
                    os.close(fd)
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                    raise
                # A peer pruning stale markers may have taken the lock in the instant before ours and deleted the
                # file; then nobody could see this lock, so start again under a new name.
                if _same_file(fd, path):
                    return cls(owner, path, fd)
                os.close(fd)
            raise FileExistsError("no free marker name")
        except (OSError, ValueError) as error:  # ValueError: a path with a NUL byte
            logger.debug("server liveness is not recorded (%s): peers cannot tell whether this server runs", error)
            return cls(secrets.token_hex(8), None, None)

    @property
    def recorded(self) -> bool:
        """Whether peers can see this server's liveness (a marker file exists and this process holds its lock)."""
        return self._fd is not None

    def release(self, *, leave_marker: bool = False) -> None:
        """Drop the lock; delete the file unless ``leave_marker``. Idempotent.

        :param leave_marker: keep the (now unlocked) file, so that peers read this server as stopped and remove the
            containers it could not remove itself.
        """
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if not leave_marker and self.path is not None:
            try:
                os.unlink(self.path)
            except OSError:
                logger.debug("the liveness marker could not be deleted; the next sweep prunes it")
        os.close(fd)


def owner_alive(state_dir: Path, owner: str) -> bool | None:
    """Whether the server with this owner token runs: ``True`` live, ``False`` stopped, ``None`` unknown.

    Unknown: not a valid token, no marker (another machine's server, or one that never recorded itself), or a marker
    that is not a private regular file. Never raises, never blocks, never changes the marker.
    """
    return _probe(state_dir, owner, forget=False)


def prune_stopped_servers(state_dir: Path, *, keep: Collection[str] = ()) -> int:
    """Delete the markers of stopped servers, except those whose owner is in ``keep``. Returns how many went.

    A stopped server's marker is the only evidence that its containers are orphans: prune it only once none of them
    is left (``keep`` names the owners of every container that remains).
    """
    if sys.platform == "win32":
        return 0
    try:
        servers = _servers_dir(state_dir, create=False)
        names = os.listdir(servers) if servers is not None else []
    except (OSError, ValueError):
        return 0
    owners = [match.group(1) for name in names if (match := _MARKER_NAME.fullmatch(name))]
    return sum(1 for owner in owners if owner not in keep and _probe(state_dir, owner, forget=True) is False)


def _probe(state_dir: Path, owner: str, *, forget: bool) -> bool | None:
    if sys.platform == "win32" or _OWNER.fullmatch(owner) is None:
        return None
    try:
        servers = _servers_dir(state_dir, create=False)
        if servers is None:
            return None
        path = servers / f"{owner}.lock"
        # O_NOFOLLOW: a planted symlink fails (ELOOP). O_NONBLOCK: opening a planted FIFO does not wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        if forget and _same_file(fd, path):
            os.unlink(path)  # while holding the lock, and only the file that was judged
        return False
    except OSError:
        return None
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.lstat(path))
    except OSError:
        return False


def is_private_directory(info: os.stat_result) -> bool:
    """Whether ``info`` (from ``lstat``) is a real directory of this user that nobody else can write: the only kind
    in which what the state directory records is believed."""
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022


def _servers_dir(state_dir: Path, *, create: bool) -> Path | None:
    """``state_dir/servers`` when it is a private directory (:func:`is_private_directory`), else ``None``."""
    servers = state_dir / SERVERS_DIR
    if create:
        servers.mkdir(mode=0o700, parents=True, exist_ok=True)
    return servers if is_private_directory(os.lstat(servers)) else None
