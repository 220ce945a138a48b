"""The documents make promises about the code; these tests keep the two in step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from code_sandbox.docker_engine import DockerEngine

ROOT = Path(__file__).parents[1]


def _table_rows(text: str, header: str) -> list[list[str]]:
    section = text.split(header, 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_every_promise_in_security_md_names_tests_that_exist() -> None:
    rows = _table_rows((ROOT / "SECURITY.md").read_text(), "## Promises and the tests that attack them")
    assert len(rows) >= 30
    for promise, tests in rows:
        references = re.findall(r"`([^`]+)`", tests)
        assert references, promise
        current_file = ""
        for reference in references:
            if "::" not in reference:  # a whole test file, e.g. tests/test_paths.py (property tests)
                assert (ROOT / reference.split(" ")[0]).is_file(), (promise, reference)
                continue
            file_part, name = reference.split("::")
            if file_part:  # `test_x.py::name` is under tests/security/; `::name` reuses the previous file
                current_file = file_part if file_part.startswith("tests/") else f"tests/security/{file_part}"
            source = (ROOT / current_file).read_text()
            assert re.search(rf"def {re.escape(name)}\(", source), (promise, reference)


def test_the_readme_settings_table_lists_every_setting() -> None:
    readme = (ROOT / "README.md").read_text()
    settings = (ROOT / "packages/core/src/code_sandbox/settings.py").read_text()
    fields = [*re.findall(r'_IntSetting\("(\w+)"', settings), "audit_enabled", "audit_log", "profile", "tag"]
    for field in fields:
        assert f"`CODE_SANDBOX_{field.upper()}`" in readme, field


def test_the_readme_counts_the_tests_of_this_run(request: pytest.FixtureRequest) -> None:
    """The README's test count is the suite's (within 5%, as runtimes and engines change the parametrization)."""
    stated = re.search(r"The suite \(([\d,]+) tests", (ROOT / "README.md").read_text())
    assert stated is not None
    collected = len(request.session.items)
    if collected < 500:  # a subset of the suite was selected: nothing to compare
        return
    assert abs(int(stated.group(1).replace(",", "")) - collected) <= collected * 0.05, collected


@pytest.mark.docker
def test_the_readme_states_the_images_size(image_id: str, engine: DockerEngine) -> None:
    stated = re.search(r"runc\): (\d+) MB as `docker images` counts it", (ROOT / "README.md").read_text())
    assert stated is not None
    facts = engine.image_facts(image_id)
    assert facts is not None
    assert abs(int(stated.group(1)) - facts.size / 1e6) <= 5, facts.size
