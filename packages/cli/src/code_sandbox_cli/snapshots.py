"""``code-sandbox snapshots list|rm``, and the part of ``reap`` that removes snapshots: those past the age limit, and
orphans (images of snapshots that no name leads to any more)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from code_sandbox.errors import SandboxError
from code_sandbox.hardening import LABEL_TAG
from code_sandbox.liveness import default_state_dir
from code_sandbox.settings import TAG_RULE, Settings, is_valid_tag

from code_sandbox_cli.tables import duration, print_table, shown

if TYPE_CHECKING:
    from code_sandbox.engine import Engine
    from code_sandbox.sandbox.snapshot_store import SnapshotInfo, SnapshotStore

app = typer.Typer(help="The snapshots sandboxes were saved to (snapshot_sandbox), kept on the engine.")

TagOption = Annotated[
    str | None, typer.Option("--tag", help="Only the snapshots of servers started with this CODE_SANDBOX_TAG.")
]


def store_for(engine: Engine, settings: Settings) -> SnapshotStore:
    """A store on ``engine``; its profile and tag matter only to what a server sees, not to an operator's rows."""
    from code_sandbox.sandbox.snapshot_store import SnapshotStore

    return SnapshotStore(engine, settings, settings.profile or "-", default_state_dir())


def _of_tag(infos: list[SnapshotInfo], tag: str | None) -> list[SnapshotInfo]:
    return infos if tag is None else [info for info in infos if info.tag == tag]


def _checked_tag(tag: str | None) -> None:
    if tag is not None and not is_valid_tag(tag):
        typer.echo(f"code-sandbox: --tag {TAG_RULE}", err=True)
        raise typer.Exit(2)


def _size(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB" if size >= 1024 * 1024 else f"{size / 1024:.0f} KiB"


@app.command("list")
def list_command(tag: TagOption = None) -> None:
    """Every snapshot on the engine: its name, profile, tag, files, size, age, time left, and whether its seal holds
    under this machine's key (a snapshot that fails it is never restored)."""
    from code_sandbox.docker_engine import DockerEngine

    from code_sandbox_cli.main import check_engine, fail, load_checked_settings

    _checked_tag(tag)
    settings = load_checked_settings()
    check_engine(settings)
    with DockerEngine.for_settings(settings) as engine:
        try:
            store = store_for(engine, settings)
            infos = _of_tag(store.kept(every_scope=True), tag)
            now = engine.now()
        except SandboxError as error:
            fail(error)
    rows = [
        (
            shown(info.name, 63), shown(info.profile, 30), shown(info.tag or "-", 63), str(info.files),
            _size(info.bytes), duration(now - info.created), duration(info.created + store.max_age - now),
            "ok" if info.sealed else "FAILS",
        )
        for info in infos
    ]  # fmt: skip
    print_table(("NAME", "PROFILE", "TAG", "FILES", "SIZE", "AGE", "EXPIRES IN", "SEAL"), rows)
    typer.echo(f"{len(rows)} snapshot(s)")


@app.command("rm")
def rm_command(
    names: Annotated[list[str], typer.Argument(help="The names of the snapshots to remove.", metavar="NAME...")],
    tag: TagOption = None,
    profile: Annotated[str | None, typer.Option("--profile", help="Only the snapshots of this profile.")] = None,
) -> None:
    """Remove snapshots by name. A name that several servers' scopes (profile and tag) use is refused unless
    --profile or --tag says which (exit 2); a name no snapshot has is reported (exit 1)."""
    from code_sandbox.docker_engine import DockerEngine

    from code_sandbox_cli.main import check_engine, fail, load_checked_settings

    _checked_tag(tag)
    settings = load_checked_settings()
    check_engine(settings)
    missing = 0
    with DockerEngine.for_settings(settings) as engine:
        try:
            store = store_for(engine, settings)
            kept = [info for info in _of_tag(store.kept(every_scope=True), tag) if profile in (None, info.profile)]
            for name in names:
                named = [info for info in kept if info.name == name]
                if len(named) > 1:
                    typer.echo(
                        f"code-sandbox: {len(named)} snapshots are named {shown(name, 63)} "
                        "(fix: say which with --profile or --tag)",
                        err=True,
                    )
                    raise typer.Exit(2)
                if not named:
                    typer.echo(f"code-sandbox: no snapshot is named {shown(name, 63)}", err=True)
                    missing += 1
                    continue
                store.remove(named[0])
                typer.echo(f"removed {shown(name, 63)}")
        except SandboxError as error:
            fail(error)
    if missing:
        raise typer.Exit(1)


def reap_snapshots(engine: Engine, settings: Settings, *, tag: str | None, dry_run: bool) -> int:
    """``reap``'s share: remove (or with ``dry_run`` list) the snapshots past the age limit, of ``tag``'s servers when
    given, and the orphans (of ``tag``'s servers, when given); prints a row for each. Returns how many removals
    failed."""
    store = store_for(engine, settings)
    now = engine.now()
    rows: list[tuple[str, ...]] = []
    failures = 0
    doomed = [info for info in _of_tag(store.kept(every_scope=True), tag) if now - info.created >= store.max_age]
    for info in doomed:
        action = "WOULD REMOVE" if dry_run else "removed"
        if not dry_run:
            try:
                store.remove(info)
            except SandboxError:
                action, failures = "REMOVAL FAILED", failures + 1
        rows.append((shown(info.name, 63), shown(info.profile, 30), duration(now - info.created), f"{action} (aged)"))
    for orphan in [o for o in store.orphans() if tag is None or o.labels.get(LABEL_TAG) == tag]:
        action = "WOULD REMOVE" if dry_run else "removed"
        if not dry_run:
            try:
                engine.remove_snapshot(orphan.id)
            except SandboxError:
                action, failures = "REMOVAL FAILED", failures + 1
        rows.append(("?", "?", "?", f"{action} (orphan)"))
    if rows:
        print_table(("SNAPSHOT", "PROFILE", "AGE", "ACTION"), rows)
    typer.echo(f"{len(rows)} snapshot(s) to remove" if dry_run else f"{len(rows)} snapshot(s) past their time")
    return failures
