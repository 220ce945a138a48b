"""The container runtimes the security and conformance suites run under. Each suite's ``engine`` fixture is
parametrized by :data:`TEST_RUNTIMES`, so every test of those suites runs once per runtime named in
``CODE_SANDBOX_TEST_RUNTIMES`` (comma-separated; default ``runc,runsc``: the host's kernel and gVisor's, the two trust
models of SECURITY.md). A runtime the engine has not registered fails in CI (``CI=true``) and is skipped elsewhere.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.errors import SandboxError
from code_sandbox.hardening import LABEL_TAG

from tests.support.run import remove_tagged

TEST_RUNTIMES = tuple(os.environ.get("CODE_SANDBOX_TEST_RUNTIMES", "runc,runsc").split(","))


def runtime_engine(runtime: str, tag: str) -> Iterator[DockerEngine]:
    """An engine whose containers run under ``runtime`` and carry ``tag``; at the end, none of them may be left."""
    engine = DockerEngine(labels={LABEL_TAG: tag}, runtime=runtime)
    try:
        engine.ping()
        engine.runtime_in_force()
    except SandboxError as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and the engine cannot run {runtime} containers ({error.code})")
        pytest.skip(f"the Docker engine cannot run {runtime} containers here ({error.code})")
    yield engine
    left = remove_tagged(engine, tag)
    engine.close()
    assert left == 0, f"{left} container(s) of this worker outlived their tests"
