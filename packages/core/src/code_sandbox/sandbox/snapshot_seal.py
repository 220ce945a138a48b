"""The seal of a kept snapshot: an HMAC-SHA256, with a key only this machine's servers read, over every other label
(the content's SHA-256 among them), in one canonical form.

The key is ``snapshot.key`` in the state directory: 32 random bytes, mode 0600, made by the first server that needs
one (written whole under another name, then linked into place, so that no server ever reads a key half made), and
refused when another user could read or replace it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path

from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import LABEL_PREFIX

LABEL_SEAL = LABEL_PREFIX + "snapshot.seal"
KEY_FILE = "snapshot.key"
KEY_BYTES = 32
_SEAL = re.compile(r"[0-9a-f]{64}")


class SnapshotKey:
    """The seal's key, read from (or first made in) the state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / KEY_FILE
        self._key: bytes | None = None

    def get(self) -> bytes:
        """:raises SandboxError: ``NOT_SUPPORTED`` when the key can neither be read nor made."""
        if self._key is None:
            self._key = self._read() or self._make()
        if self._key is None:
            raise SandboxError(
                ErrorCode.NOT_SUPPORTED, "snapshots need this server's state directory, which it cannot use"
            )
        return self._key

    def _read(self) -> bytes | None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as file:
            status = os.fstat(file.fileno())
            if status.st_mode & 0o077 or status.st_uid != os.geteuid():  # another user could read or write it
                return None
            key = file.read(KEY_BYTES + 1)
        return key if len(key) == KEY_BYTES else None

    def _make(self) -> bytes | None:
        """A new key, linked into place only once it is whole; another server's when it linked one first."""
        key = secrets.token_bytes(KEY_BYTES)
        draft = self.path.with_name(f".{KEY_FILE}.{secrets.token_hex(8)}")
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            return None  # the directory is unusable
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(key)
                file.flush()
                os.fsync(file.fileno())
            os.link(draft, self.path)
        except FileExistsError:
            return self._read()
        except OSError:
            return None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(draft)
        return key

    def seal(self, labels: Mapping[str, str]) -> str:
        """The seal of ``labels`` (all but the seal's own), over their canonical JSON.

        :raises SandboxError: ``NOT_SUPPORTED`` without a key.
        """
        signed = {key: value for key, value in labels.items() if key != LABEL_SEAL}
        text = json.dumps(signed, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
        return hmac.new(self.get(), text.encode(), hashlib.sha256).hexdigest()

    def holds(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` carry their seal; ``False`` for anything else (a label that is not text included) and
        without a key."""
        seal = labels.get(LABEL_SEAL, "")
        if _SEAL.fullmatch(seal) is None:
            return False
        try:
            return hmac.compare_digest(seal.encode(), self.seal(labels).encode())
        except (SandboxError, ValueError, TypeError):
            return False
