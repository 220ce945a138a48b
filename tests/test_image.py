"""The offline image and verify-image, against a real Docker engine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.hardening import READABLE_RUNTIME_DIR
from code_sandbox.image import verify_image
from code_sandbox.image.package_sets import PACKAGES_DIGEST_LABEL, PACKAGES_LABEL
from code_sandbox.profile import Profile

from tests.support.own_tag import Variant, variant_of
from tests.support.run import worker_tag

pytestmark = pytest.mark.docker


@pytest.fixture
def variant(engine: DockerEngine, profile: Profile, image_id: str) -> Iterator[Variant]:
    with variant_of(engine, profile, image_id, f"code-sandbox-test-variant:{worker_tag()}") as variant:
        yield variant


def test_the_offline_image_passes_verification_and_stays_small(
    engine: DockerEngine, profile: Profile, image_id: str
) -> None:
    report = verify_image(engine, profile)
    assert report.passed, report.checks
    assert report.image is not None and report.image.id == image_id
    assert report.image.id.startswith("sha256:")
    assert report.runtime_version is not None and report.runtime_version.startswith("v22.")
    # The runtime twice (unreadable for runc's sealed helpers, readable for gVisor) and little else.
    assert report.image.size < 260 * 1000 * 1000


def test_verify_fails_on_a_wrong_label(variant: Variant) -> None:
    variant.build('LABEL io.code-sandbox.runtime-version="0.9.9"')
    assert variant.failed_checks() == {"labels"}


def test_verify_fails_on_a_changed_helper(variant: Variant) -> None:
    variant.build("COPY runner.mjs /opt/sandbox/runner.mjs", {"runner.mjs": b"process.exit(0)\n"})
    assert variant.failed_checks() == {"helpers match the profile's", "files"}


def test_verify_fails_when_the_readable_runtime_is_another_binary(variant: Variant) -> None:
    """gVisor runs the readable copy: it must be the recorded runtime, byte for byte, whatever the manifest says."""
    variant.build(f"COPY node {READABLE_RUNTIME_DIR}/node", {"node": b"\x7fELF another runtime"}, mode=0o755)
    assert variant.failed_checks() == {"readable runtime", "files"}


@pytest.mark.parametrize("path", ["/usr/local/bin/tool", "/lib/libtool.so.1"])
def test_verify_fails_when_a_binary_a_sandbox_can_read_is_executable(variant: Variant, path: str) -> None:
    """A process that runs a binary it can read is dumpable: its parent, user code of the same uid, could write native
    code into it through /proc/<pid>/mem. Only the copies gVisor runs may be both, where runc never shows them."""
    variant.build(f"COPY tool {path}", {"tool": b"\x7fELF a readable program"}, mode=0o755)
    assert variant.failed_checks() == {"nothing readable runs", "files"}


def test_verify_fails_when_a_shell_is_present(variant: Variant) -> None:
    variant.build("COPY sh /bin/sh", {"sh": b"\x7fELF not really a shell"})
    assert variant.failed_checks() == {"no shell or package manager", "files"}


def test_verify_fails_when_npm_is_present(variant: Variant) -> None:
    variant.build("COPY npm /usr/local/lib/node_modules/npm/bin/npm", {"npm": b"#!/usr/bin/env node\n"})
    assert variant.failed_checks() == {"no shell or package manager", "files"}


def test_verify_fails_for_a_root_user(variant: Variant) -> None:
    variant.build("USER 0:0")
    assert "non-root user" in variant.failed_checks()


def test_verify_reports_a_missing_image(variant: Variant) -> None:
    assert variant.failed_checks() == {"image present"}  # nothing is built under the test's tag


def test_verify_fails_for_a_package_tree_without_labels(variant: Variant) -> None:
    variant.build("COPY index.js /node_modules/left-pad/index.js", {"index.js": b"1\n"}, mode=0o444)
    assert variant.failed_checks() == {"package set"}


def test_verify_fails_for_package_labels_without_a_tree(variant: Variant) -> None:
    variant.build(f'LABEL {PACKAGES_LABEL}="ms@2.1.3" {PACKAGES_DIGEST_LABEL}="{"0" * 64}"')
    assert variant.failed_checks() == {"package set"}


def test_verify_fails_for_malformed_package_labels(variant: Variant) -> None:
    variant.build(f'LABEL {PACKAGES_LABEL}="ms@2.1.3 ms@2.1.3" {PACKAGES_DIGEST_LABEL}="{"0" * 64}"')
    assert variant.failed_checks() == {"package set"}
