"""How the CLI shows rows: aligned columns (rich, imported when a table is printed), and values another server wrote
made safe to show on a terminal."""

from __future__ import annotations

from collections.abc import Mapping

import typer
from code_sandbox.errors import escape_unprintable
from code_sandbox.hardening import LABEL_HOST, LABEL_OWNER


def print_table(header: tuple[str, ...] | None, rows: list[tuple[str, ...]]) -> None:
    """Columns aligned by rich, without borders; one line per row even when stdout is a pipe or a log."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console.width = 10_000
    table = Table(box=None, pad_edge=False, show_header=header is not None, header_style="bold", show_edge=False)
    for name in header or ("",) * max((len(row) for row in rows), default=0):
        table.add_column(name, no_wrap=not console.is_terminal)
    for row in rows:
        # Plain text ("[...]" is not markup), every character a terminal would act on shown as its escape: a detail
        # may quote a path inside an image or a package's file name.
        table.add_row(*(Text(escape_unprintable(cell)) for cell in row))
    with console.capture() as captured:
        console.print(table)
    for line in captured.get().splitlines():
        typer.echo(line.rstrip())  # rich pads the last column too


def server_of(labels: Mapping[str, str]) -> str:
    """``token@machine`` from a container's owner and host labels."""
    return f"{shown(labels.get(LABEL_OWNER, '?'), 8)}@{shown(labels.get(LABEL_HOST, '?'), 63)}"


def shown(text: str, limit: int) -> str:
    """A label's value for the terminal: another server (maybe on another machine) wrote it, so letters, digits and
    ``.-_:`` only (no escape sequence gets through), at most ``limit`` of them."""
    return "".join(ch for ch in text[:limit] if ch.isascii() and (ch.isalnum() or ch in ".-_:")) or "?"


def duration(seconds: float) -> str:
    if seconds < 0:
        return "past"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes < 600 else f"{minutes // 60}h"
