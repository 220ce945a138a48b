"""Run ``code-sandbox serve`` and copy every byte it writes to stdout into a file as well.

Usage: python stdout_tee.py <capture-file> <server argv...>. Tests use it to check that the server's stdout
carries JSON-RPC and nothing else.
"""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from typing import cast


def main() -> int:
    capture_path, argv = sys.argv[1], sys.argv[2:]
    with (
        open(capture_path, "wb") as capture,
        subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as child,
    ):
        assert child.stdin is not None and child.stdout is not None
        child_stdin, child_stdout = child.stdin, cast(io.BufferedReader, child.stdout)
        own_stdin = cast(io.BufferedReader, sys.stdin.buffer)

        def pump_stdin() -> None:
            try:
                while chunk := own_stdin.read1(65536):
                    child_stdin.write(chunk)
                    child_stdin.flush()
            finally:
                child_stdin.close()

        threading.Thread(target=pump_stdin, daemon=True).start()
        while chunk := child_stdout.read1(65536):
            capture.write(chunk)
            capture.flush()
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
        return child.wait()


if __name__ == "__main__":
    sys.exit(main())
