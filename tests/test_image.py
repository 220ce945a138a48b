"""The offline image and verify-image, against a real Docker engine."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Iterator

import pytest
from code_sandbox.engine import DockerEngine
from code_sandbox.image import verify_image
from code_sandbox.plugins import Profile

pytestmark = pytest.mark.docker

Build = Callable[..., None]
BACKUP_TAG = "code-sandbox-test-backup:good"


def _context(dockerfile: str, files: dict[str, bytes]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in {"Dockerfile": dockerfile.encode(), **files}.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(data)
            entry.mode = 0o555
            archive.addfile(entry, io.BytesIO(data))
    buffer.seek(0)
    return buffer


@pytest.fixture
def tampered(engine: DockerEngine, profile: Profile, image_id: str) -> Iterator[Build]:
    """Build a variant of the good image under the allowlisted tag; put the good image back afterwards."""
    tag = profile.image_spec().tag

    def build(dockerfile_tail: str, files: dict[str, bytes] | None = None) -> None:
        dockerfile = f"FROM {image_id}\n{dockerfile_tail}\n"
        engine.build_image(_context(dockerfile, files or {}), tag=tag, labels={}, on_step=lambda _step: None)

    engine.tag_image(image_id, BACKUP_TAG)
    yield build
    engine.tag_image(image_id, tag)
    engine.untag_image(BACKUP_TAG)
    assert verify_image(engine, profile).passed


def _failed(engine: DockerEngine, profile: Profile) -> set[str]:
    report = verify_image(engine, profile)
    assert not report.passed
    return {check.name for check in report.checks if not check.passed}


def test_the_offline_image_passes_verification_and_stays_small(
    engine: DockerEngine, profile: Profile, image_id: str
) -> None:
    report = verify_image(engine, profile)
    assert report.passed, report.checks
    assert report.image is not None and report.image.id == image_id
    assert report.image.id.startswith("sha256:")
    assert report.runtime_version is not None and report.runtime_version.startswith("v22.")
    assert report.image.size < 130 * 1000 * 1000


def test_verify_fails_on_a_wrong_label(engine: DockerEngine, profile: Profile, tampered: Build) -> None:
    tampered('LABEL io.code-sandbox.runtime-version="0.9.9"')
    assert _failed(engine, profile) == {"labels"}


def test_verify_fails_on_a_changed_helper(engine: DockerEngine, profile: Profile, tampered: Build) -> None:
    tampered("COPY runner.mjs /opt/sandbox/runner.mjs", {"runner.mjs": b"process.exit(0)\n"})
    assert _failed(engine, profile) == {"helpers match containers/"}


def test_verify_fails_when_a_shell_is_present(engine: DockerEngine, profile: Profile, tampered: Build) -> None:
    tampered("COPY sh /bin/sh", {"sh": b"\x7fELF not really a shell"})
    assert _failed(engine, profile) == {"no shell or package manager"}


def test_verify_fails_when_npm_is_present(engine: DockerEngine, profile: Profile, tampered: Build) -> None:
    tampered("COPY npm /usr/local/lib/node_modules/npm/bin/npm", {"npm": b"#!/usr/bin/env node\n"})
    assert _failed(engine, profile) == {"no shell or package manager"}


def test_verify_fails_for_a_root_user(engine: DockerEngine, profile: Profile, tampered: Build) -> None:
    tampered("USER 0:0")
    assert "non-root user" in _failed(engine, profile)


def test_verify_reports_a_missing_image(engine: DockerEngine, profile: Profile, image_id: str) -> None:
    tag = profile.image_spec().tag
    engine.tag_image(image_id, BACKUP_TAG)  # keeps the image alive while its allowlisted tag is gone
    engine.untag_image(tag)
    try:
        assert _failed(engine, profile) == {"image present"}
    finally:
        engine.tag_image(image_id, tag)
        engine.untag_image(BACKUP_TAG)
