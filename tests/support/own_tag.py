"""Images of a test's own: the installed profile under a tag of the test's own, and variants of a good image built
under it, so that what a test builds never touches the shared image."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from code_sandbox.docker_engine import DockerEngine
from code_sandbox.image import verify_image
from code_sandbox.profile import HelperKind, ImageContents, ImageSpec, PackageSet, Profile

from tests.support.images import untag_image


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

    def package_set(self, manifest: Path, *, sources: Path | None, progress: Callable[[str], None]) -> PackageSet:
        return self.base.package_set(manifest, sources=sources, progress=progress)

    def describe_packages(self, packages: Sequence[str]) -> str:
        return self.base.describe_packages(packages)

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

    def build(self, dockerfile_tail: str, files: dict[str, bytes] | None = None, *, mode: int = 0o444) -> None:
        """Build ``FROM`` the good image plus ``dockerfile_tail``; ``files`` are in the context with ``mode``."""
        dockerfile = f"FROM {self.good_image}\n{dockerfile_tail}\n"
        tag = self.profile.image_spec().tag
        # One instruction after FROM and no build labels: one image, no intermediate ones left behind.
        context = _context(dockerfile, files or {}, mode)
        self.engine.build_image(context, tag=tag, labels={}, on_step=lambda _step: None)

    def failed_checks(self) -> set[str]:
        report = verify_image(self.engine, self.profile)
        assert not report.passed
        return {check.name for check in report.checks if not check.passed}


def _context(dockerfile: str, files: dict[str, bytes], mode: int) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in {"Dockerfile": dockerfile.encode(), **files}.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(data)
            entry.mode = mode
            archive.addfile(entry, io.BytesIO(data))
    buffer.seek(0)
    return buffer


@contextmanager
def variant_of(engine: DockerEngine, profile: Profile, good_image: str, tag: str) -> Generator[Variant]:
    """Variants of ``good_image`` under ``tag``: nothing is there until the test builds it; afterwards the tag and the
    variant are gone."""
    assert engine.image_facts(tag) is None, f"{tag} is left from an earlier test"
    yield Variant(engine, OwnTagProfile(profile, tag), good_image)
    # Removing a variant's last tag removes the variant (not its parent, the good image); it fails while a
    # container still uses it. Another run's identical variant (the build cache) goes with that run's tag.
    untag_image(engine, tag)
