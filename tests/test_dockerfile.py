"""Keep containers/Dockerfile.nodejs (for hosts with a registry) honest against the offline build."""

from __future__ import annotations

import re
from pathlib import Path

from code_sandbox.channel.protocol import PROTOCOL_LABEL, PROTOCOL_VERSION
from code_sandbox.profile import Profile

DOCKERFILE = Path(__file__).parents[1] / "containers" / "Dockerfile.nodejs"
HELPERS = "packages/profile-javascript/src/code_sandbox_javascript/helpers"  # the build context is the checkout


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    rows: list[tuple[str, str]] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            rows.append((keyword.upper(), rest.strip()))
    return rows


def _final_stage() -> list[tuple[str, str]]:
    rows = _instructions()
    last_from = max(i for i, (keyword, _) in enumerate(rows) if keyword == "FROM")
    return rows[last_from:]


def test_every_base_image_is_pinned_by_digest() -> None:
    bases = [rest for keyword, rest in _instructions() if keyword == "FROM"]
    assert len(bases) == 2
    for base in bases:
        assert re.search(r"@sha256:[0-9a-f]{64}\b", base), base
    assert bases[0].startswith("node:22-bookworm-slim@")


def test_final_stage_is_distroless_cc_nonroot_without_run() -> None:
    stage = _final_stage()
    assert stage[0][1].startswith("gcr.io/distroless/cc-debian12:nonroot@sha256:")
    assert not [rest for keyword, rest in stage if keyword == "RUN"]


def test_final_stage_has_the_offline_builds_labels_user_and_paths(profile: Profile) -> None:
    stage = _final_stage()
    spec = profile.image_spec()
    labels = dict(re.findall(r'([\w.-]+)="([^"]*)"', " ".join(rest for keyword, rest in stage if keyword == "LABEL")))
    assert set(labels) == {*spec.labels, spec.runtime_version_label, PROTOCOL_LABEL}
    assert labels[PROTOCOL_LABEL] == str(PROTOCOL_VERSION)
    for key in ("io.code-sandbox.profile", "io.code-sandbox.runtime-version"):
        assert labels[key] == spec.labels[key]
    assert ("USER", "65533:65533") in stage
    copies = " ".join(rest for keyword, rest in stage if keyword == "COPY")
    assert f"/node {spec.runtime_path}" in copies
    for helper_path in spec.helper_digests:
        assert helper_path.startswith("/opt/sandbox/")
        assert f"{HELPERS}/{Path(helper_path).name}" in copies
    assert "--chmod=0444" in copies  # helpers: readable, never executable (nothing readable runs)
    assert f"--chown=0:0 --chmod=0711 /usr/local/bin/node {spec.runtime_path}" in copies
