"""``python -m tests.support.clients install``: install the pinned MCP clients (CI runs it before the tests);
``python -m tests.support.clients path``: print where the inspector's launcher is."""

from __future__ import annotations

import sys

from tests.support.clients import install, launcher


def main(argv: list[str]) -> int:
    if argv == ["install"]:
        sys.stdout.write(f"{install()}\n")
        return 0
    if argv == ["path"]:
        sys.stdout.write(f"{launcher()}\n")
        return 0
    sys.stderr.write("usage: python -m tests.support.clients install | path\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
