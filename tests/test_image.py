"""The offline image and verify-image, against a real Docker engine."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from code_sandbox.engine import DockerEngine
from code_sandbox.image import verify_image
from code_sandbox.profile import HelperKind, ImageContents, ImageSpec, Profile

from tests.support.run import worker_tag

pytestmark = pytest.mark.docker


class OwnTagProfile(Profile):
    """The installed profile under another name, whose image spec names a tag of the test's own: verification
    then looks at what the test built, and the shared image and its allowlisted tag stay untouched."""

    def __init__(self, base: Profile, tag: str) -> None:
        self.base = base
        self.tag = tag
        self.info = replace(base.info, name=f"{base.name}-own-tag")

    def image_spec(self) -> ImageSpec:
        return replace(self.base.image_spec(), tag=self.tag)

    def image_contents(self, runtime: Path | None) -> ImageContents:
        return self.base.image_contents(runtime)

    def build_run_argv(self, entrypoint: str, arguments: Sequence[str]) -> list[str]:
        return self.base.build_run_argv(entrypoint, arguments)

    def helper_argv(self, helper: HelperKind) -> list[str]:
        return self.base.helper_argv(helper)

    def probe_argv(self) -> list[str]:
        return self.base.probe_argv()


@dataclass
class Variant:
    """Variants of the good image, built under a tag of this worker's own and checked with :class:`OwnTagProfile`."""

    engine: DockerEngine
    profile: Profile
    good_image: str

    def build(self, dockerfile_tail: str, files: dict[str, bytes] | None = None) -> None:
        dockerfile = f"FROM {self.good_image}\n{dockerfile_tail}\n"
        tag = self.profile.image_spec().tag
        # One instruction after FROM and no build labels: one image, no intermediate ones left behind.
        self.engine.build_image(_context(dockerfile, files or {}), tag=tag, labels={}, on_step=lambda _step: None)

    def failed_checks(self) -> set[str]:
        report = verify_image(self.engine, self.profile)
        assert not report.passed
        return {check.name for check in report.checks if not check.passed}


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
def variant(engine: DockerEngine, profile: Profile, image_id: str) -> Iterator[Variant]:
    """Nothing is built under the test's tag until the test builds it; afterwards the tag and the variant are gone."""
    tag = f"code-sandbox-test-variant:{worker_tag()}"
    own = OwnTagProfile(profile, tag)
    assert engine.image_facts(tag) is None, f"{tag} is left from an earlier test"
    yield Variant(engine, own, image_id)
    # Removing a variant's last tag removes the variant (not its parent, the good image); it fails while a
    # container still uses it. Another run's identical variant (the build cache) goes with that run's tag.
    engine.untag_image(tag)


def test_the_offline_image_passes_verification_and_stays_small(
    engine: DockerEngine, profile: Profile, image_id: str
) -> None:
    report = verify_image(engine, profile)
    assert report.passed, report.checks
    assert report.image is not None and report.image.id == image_id
    assert report.image.id.startswith("sha256:")
    assert report.runtime_version is not None and report.runtime_version.startswith("v22.")
    assert report.image.size < 130 * 1000 * 1000


def test_verify_fails_on_a_wrong_label(variant: Variant) -> None:
    variant.build('LABEL io.code-sandbox.runtime-version="0.9.9"')
    assert variant.failed_checks() == {"labels"}


def test_verify_fails_on_a_changed_helper(variant: Variant) -> None:
    variant.build("COPY runner.mjs /opt/sandbox/runner.mjs", {"runner.mjs": b"process.exit(0)\n"})
    assert variant.failed_checks() == {"helpers match the profile's"}


def test_verify_fails_when_a_shell_is_present(variant: Variant) -> None:
    variant.build("COPY sh /bin/sh", {"sh": b"\x7fELF not really a shell"})
    assert variant.failed_checks() == {"no shell or package manager"}


def test_verify_fails_when_npm_is_present(variant: Variant) -> None:
    variant.build("COPY npm /usr/local/lib/node_modules/npm/bin/npm", {"npm": b"#!/usr/bin/env node\n"})
    assert variant.failed_checks() == {"no shell or package manager"}


def test_verify_fails_for_a_root_user(variant: Variant) -> None:
    variant.build("USER 0:0")
    assert "non-root user" in variant.failed_checks()


def test_verify_reports_a_missing_image(variant: Variant) -> None:
    assert variant.failed_checks() == {"image present"}  # nothing is built under the test's tag
