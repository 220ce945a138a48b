"""The ``code-sandbox`` command line. Each command parses its options, calls one core function, shapes output.

Core's heavier modules (Docker's client, the MCP SDK, rich) are imported by the commands that use them, so that
``serve`` starts answering its client before they have loaded.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Annotated, NoReturn

import anyio
import typer
from code_sandbox.errors import SandboxError
from code_sandbox.hardening import LABEL_PROFILE, LABEL_SESSION
from code_sandbox.limits import WORDS
from code_sandbox.liveness import default_state_dir
from code_sandbox.plugins import create_plugin_manager, select_profile
from code_sandbox.profile import Profile
from code_sandbox.settings import TAG_RULE, Settings, SettingsError, is_valid_tag, load_settings
from code_sandbox.timeline import milestone

from code_sandbox_cli import snapshots
from code_sandbox_cli.snapshots import reap_snapshots
from code_sandbox_cli.tables import duration, print_table, server_of, shown

app = typer.Typer(
    name="code-sandbox",
    help="Run model-written code in disposable, offline, locked-down Docker sandboxes, over MCP.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.add_typer(snapshots.app, name="snapshots")


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
    """Print one line to stderr (the error, what the engine said, and the fix) and exit; never a traceback."""
    hint = f" (fix: {error.hint})" if error.hint else ""
    typer.echo(f"code-sandbox: {error.for_operator()}{hint}", err=True)
    raise typer.Exit(status)


def load_checked_settings() -> Settings:
    try:
        return load_settings()
    except SandboxError as error:
        fail(error, status=2)


def check_engine(settings: Settings) -> None:
    """An engine address or TLS set-up that cannot be used, or a runtime the engine has not registered, stops the
    command at once (exit 2), not at its first sandbox. An engine that does not answer is not checked here: every
    call then says so. Without any of those settings nothing is checked here, and the docker SDK is not imported
    before serve's start-up (the current Docker context is checked at the first call, as every address is)."""
    if settings.runtime is None and not (os.environ.get("DOCKER_HOST") or os.environ.get("DOCKER_CONTEXT")):
        return
    from code_sandbox.docker_engine import DockerEngine, EngineAddress

    try:
        EngineAddress.from_environment().require_checked()
    except SettingsError as error:
        fail(error, status=2)
    if settings.runtime is None:
        return
    with DockerEngine.for_settings(settings) as engine:
        try:
            engine.runtime_in_force()
        except SettingsError as error:
            fail(error, status=2)
        except SandboxError:
            pass


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
    _configure_logging(verbose)
    milestone("serve started (the CLI imported)")
    settings = load_checked_settings()
    profile = _profile(settings)
    check_engine(settings)
    from code_sandbox.serve.stdio import run_stdio_server

    try:
        run_stdio_server(settings, profile)
    except SandboxError as error:
        fail(error)


@app.command("run")
def run_command(
    path: Annotated[
        Path,
        typer.Argument(
            help="A file, or a folder of files (the profile's default entrypoint runs unless --entrypoint says "
            "otherwise).",
            exists=True,
            resolve_path=True,
        ),
    ],
    arguments: Annotated[
        list[str] | None, typer.Argument(help="Arguments for the program; put them after `--`.", show_default=False)
    ] = None,
    entrypoint: Annotated[
        str | None, typer.Option("--entrypoint", "-e", help="The file to run, relative to PATH's folder.")
    ] = None,
    timeout: Annotated[
        int | None, typer.Option("--timeout", help="Seconds before the program is killed (default: the setting).")
    ] = None,
) -> None:
    """Run a local file or folder in a fresh sandbox, stream its output, and exit with its exit code.

    Example: code-sandbox run examples/hello
    """
    settings = load_checked_settings()
    profile = _profile(settings)
    check_engine(settings)
    _configure_logging(verbose=False)
    try:
        status = anyio.run(_run_local, settings, profile, path, entrypoint, arguments or [], timeout)
    except SandboxError as error:
        fail(error)
    raise typer.Exit(status)


async def _run_local(
    settings: Settings,
    profile: Profile,
    path: Path,
    entrypoint: str | None,
    arguments: list[str],
    timeout_seconds: int | None,
) -> int:
    from code_sandbox.docker_engine import DockerEngine
    from code_sandbox.sandbox.local_run import run_local
    from code_sandbox.sandbox.service import SandboxService

    printed = {"stdout": 0, "stderr": 0}
    sinks = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}

    async def show(stream: str, data: bytes) -> None:
        sinks[stream].write(data)
        sinks[stream].flush()
        printed[stream] += len(data)

    with DockerEngine.for_settings(settings) as engine:
        service = SandboxService(replace(settings, warm_pool=0), profile, engine=engine)
        result = await run_local(
            service, path, entrypoint=entrypoint, arguments=arguments, timeout_seconds=timeout_seconds, output=show
        )
    # Whatever did not stream (a client that fell behind) comes from the result.
    await show("stdout", result.stdout_raw[printed["stdout"] :])
    await show("stderr", result.stderr_raw[printed["stderr"] :])
    notes = {
        "timed_out": f"the program was killed at its timeout after {result.duration_ms} ms",
        "OUTPUT_LIMIT_EXCEEDED": f"the program was killed for writing more than {WORDS['output_cap']} to one stream",
        "oom_killed": f"the program was killed by the {WORDS['memory']} memory limit",
    }
    if result.termination_reason in notes:
        typer.echo(f"code-sandbox: {notes[result.termination_reason]}", err=True)
    if result.exit_code is not None:
        return result.exit_code
    # Like a shell: 128 + the signal's number (SIGKILL -> 137).
    name = result.signal or ""
    return 128 + signal.Signals[name].value if name in signal.Signals.__members__ else 1


@app.command()
def doctor() -> None:
    """Check Docker, the enforced hardening, the image, the settings and the audit log; print a fix for each failure."""
    from code_sandbox.docker_engine import DockerEngine
    from code_sandbox.doctor import Finding, run_doctor

    profile: Profile | None
    try:
        profile = select_profile(create_plugin_manager(), os.environ.get("CODE_SANDBOX_PROFILE") or None)
    except SandboxError:
        profile = None
    try:
        engine = DockerEngine.for_settings(load_settings())
    except SandboxError:
        engine = DockerEngine()  # the settings finding reports it
    with engine:
        findings = run_doctor(engine, profile)
    if profile is None:
        findings.insert(0, Finding("profile", False, "no usable runtime profile", "uv sync --frozen"))
    rows: list[tuple[str, ...]] = []
    for finding in findings:
        rows.append(("PASS" if finding.passed else "FAIL", finding.name, finding.detail))
        if finding.fix:
            rows.append(("", "", f"fix: {finding.fix}"))
    print_table(None, rows)
    if not all(finding.passed for finding in findings):
        raise typer.Exit(1)


@app.command("build-image")
def build_image(
    offline: Annotated[
        bool,
        typer.Option("--offline", help="Build FROM scratch with no registry access (the supported path here)."),
    ] = False,
    runtime: Annotated[
        Path | None,
        typer.Option(
            "--runtime",
            help="A runtime binary to put in the image instead of the profile's own: a Linux executable for the "
            "Docker engine's architecture.",
            exists=True,
            dir_okay=False,
            resolve_path=True,
        ),
    ] = None,
    packages: Annotated[
        Path | None,
        typer.Option(
            "--packages",
            help="Vendor the packages this lockfile pins into the image, read-only; the profile says which format "
            "it reads and checks every package (README: Offline package sets).",
            exists=True,
            dir_okay=False,
            resolve_path=True,
            metavar="LOCKFILE",
        ),
    ] = None,
    tarballs: Annotated[
        Path | None,
        typer.Option(
            "--tarballs",
            help="Take the packages from this directory of package archives, or package cache, instead of "
            "downloading them (each is found by its digest).",
            exists=True,
            file_okay=False,
            resolve_path=True,
            metavar="DIR",
        ),
    ] = None,
) -> None:
    """Build the sandbox image and tag it with the profile's single allowlisted tag."""
    from code_sandbox.docker_engine import DockerEngine
    from code_sandbox.image import build_offline_image

    settings = load_checked_settings()
    profile = _profile(settings)
    if not offline:
        typer.echo(
            "code-sandbox: only offline builds are done by this command "
            "(fix: run `code-sandbox build-image --offline`)",
            err=True,
        )
        raise typer.Exit(2)
    if tarballs is not None and packages is None:
        typer.echo("code-sandbox: --tarballs needs --packages", err=True)
        raise typer.Exit(2)
    check_engine(settings)

    def progress(text: str) -> None:
        typer.echo(f"  {text}", err=True)

    with DockerEngine.for_settings(settings) as engine:
        try:
            vendored = None if packages is None else profile.package_set(packages, sources=tarballs, progress=progress)
            image_id = build_offline_image(engine, profile, runtime=runtime, progress=progress, packages=vendored)
        except SandboxError as error:
            fail(error)
    listed = f", packages: {' '.join(vendored.packages)}" if vendored is not None else ""
    typer.echo(f"built {profile.image_spec().tag} ({image_id[:19]}){listed}")


@app.command("verify-image")
def verify_image_command() -> None:
    """Check the sandbox image: immutable ID, exact labels and configuration, non-root, no shell or package manager,
    every file as the build recorded it, helpers, a hardened run."""
    from code_sandbox.docker_engine import DockerEngine
    from code_sandbox.image import verify_image

    settings = load_checked_settings()
    profile = _profile(settings)
    check_engine(settings)
    with DockerEngine.for_settings(settings) as engine:
        try:
            report = verify_image(engine, profile)
        except SandboxError as error:
            fail(error)
    print_table(None, [("PASS" if check.passed else "FAIL", check.name, check.detail) for check in report.checks])
    if not report.passed:
        typer.echo(
            "code-sandbox: the image failed verification (fix: run `code-sandbox build-image --offline`)", err=True
        )
        raise typer.Exit(1)


@app.command()
def reap(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be removed; remove nothing.")] = False,
    all_: Annotated[
        bool, typer.Option("--all", help="Remove every managed container, live sessions of running servers too.")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm --all without a prompt.")] = False,
    tag: Annotated[
        str | None,
        typer.Option("--tag", help="Only the containers of servers started with this CODE_SANDBOX_TAG.", metavar="TAG"),
    ] = None,
) -> None:
    """List managed sandbox containers and remove the stopped, expired and orphaned ones, then the snapshots past
    their age limit (CODE_SANDBOX_SNAPSHOT_MAX_AGE_HOURS) and orphaned snapshot images (exit 1 if a removal failed).

    OWNER says whether the server that made a container still runs: live, dead (its containers are orphans), or ?
    (unknown: another machine's or user's server, or one that could not record itself).
    """
    from code_sandbox.docker_engine import DockerEngine
    from code_sandbox.sandbox.sweep import apply_verdicts, survey_managed

    settings = load_checked_settings()
    if tag is not None and not is_valid_tag(tag):
        typer.echo(f"code-sandbox: --tag {TAG_RULE}", err=True)
        raise typer.Exit(2)
    if all_ and not yes and not dry_run:
        typer.echo("code-sandbox: --all removes live sandboxes too (fix: add --yes to confirm)", err=True)
        raise typer.Exit(2)
    check_engine(settings)
    _configure_logging(verbose=False)  # a failed removal is logged with the engine's words
    state_dir = default_state_dir()
    with DockerEngine.for_settings(settings) as engine:
        try:
            verdicts = survey_managed(engine, max_lifetime=settings.max_lifetime, state_dir=state_dir, tag=tag)
            actions = apply_verdicts(engine, verdicts, state_dir=state_dir, tag=tag, everything=all_, dry_run=dry_run)
            now = engine.now()
            rows: list[tuple[str, ...]] = []
            for verdict, action in zip(verdicts, actions, strict=True):
                container = verdict.container
                rows.append((
                    shown(container.labels.get(LABEL_SESSION, "?"), 16),
                    shown(container.labels.get(LABEL_PROFILE, "?"), 20),
                    duration(now - container.created) if container.created is not None else "?",
                    duration(verdict.expires_at - now) if verdict.expires_at is not None else "?",
                    shown(container.state, 8),
                    server_of(container.labels),
                    "?" if verdict.owner == "unknown" else verdict.owner,
                    f"{action} ({verdict.reason if not all_ else 'all'})",
                ))  # fmt: skip
            print_table(("SESSION", "PROFILE", "AGE", "EXPIRES IN", "STATE", "SERVER", "OWNER", "ACTION"), rows)
            typer.echo(f"{len(verdicts)} managed container(s)")
            failures = actions.count("REMOVAL FAILED")
            failures += reap_snapshots(engine, settings, tag=tag, dry_run=dry_run)
        except SandboxError as error:
            fail(error)
    if failures:
        typer.echo(
            f"code-sandbox: {failures} removal(s) failed (fix: check `docker info`, then run reap again)", err=True
        )
        raise typer.Exit(1)
