"""The Docker adapter reads nothing of an engine answer that its model does not accept: an answer of another shape is
our error, without the engine's words, and an answer's extra fields are ignored. The SDK's client is played back:
no real engine can be made to answer out of shape."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import docker
import pytest
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.docker_engine.images import follow_build
from code_sandbox.errors import ErrorCode, SandboxError


def answering(answer: object) -> Callable[..., object]:
    """An SDK call that answers ``answer`` whatever it is asked."""

    def call(*_args: object, **_kwargs: object) -> object:
        return answer

    return call


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[DockerEngine]:
    monkeypatch.setattr(docker.APIClient, "version", answering({"ApiVersion": "1.41"}))
    engine = DockerEngine(base_url="unix:///nonexistent/docker.sock")
    yield engine
    engine.close()


@pytest.mark.parametrize(
    "answer",
    [
        {"Id": 5, "State": {"Status": "running"}},  # an ID that is no string
        {"Id": "c", "Config": {"Labels": {"a": 1}}},  # a label value that is no string
        {"Id": "c", "State": "running"},  # a state that is no object
        ["not", "an", "object"],
    ],
)
def test_an_inspect_answer_of_another_shape_is_our_error_without_the_engines_words(
    engine: DockerEngine, monkeypatch: pytest.MonkeyPatch, answer: object
) -> None:
    monkeypatch.setattr(docker.APIClient, "inspect_container", answering(answer))
    with pytest.raises(SandboxError) as caught:
        engine.container_facts("c")
    assert (caught.value.code, caught.value.message) == (
        ErrorCode.CONTAINER_UNAVAILABLE,
        "the Docker engine could not inspect a sandbox",
    )
    assert caught.value.engine_text is None and caught.value.__cause__ is None


def test_fields_the_adapter_does_not_read_are_ignored_and_null_reads_as_empty(
    engine: DockerEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer = {
        "Id": "c",
        "Created": "2026-12-04T10:00:00.5Z",
        "Config": {"Labels": None, "Env": None, "Whatever": {"nested": [1, 2]}},
        "State": {"Status": "exited", "ExitCode": 0},
        "Mounts": None,
        "NewerField": True,
    }
    monkeypatch.setattr(docker.APIClient, "inspect_container", answering(answer))
    facts = engine.container_facts("c")
    assert facts is not None
    assert (facts.id, dict(facts.labels), facts.state, facts.created) == ("c", {}, "exited", 1796378400.5)


def test_a_build_stream_yields_the_classic_builders_image_id_and_skips_buildkits_trace() -> None:
    steps: list[str] = []
    events = [
        {"stream": "Step 1/2 : FROM scratch\n"},
        {"aux": "YnVpbGRraXQgdHJhY2U="},  # BuildKit's trace: base64, not an object
        {"aux": {"ID": "sha256:" + "a" * 64}},
        {"stream": "Successfully built aaaaaaaaaaaa\n"},
    ]
    assert follow_build(events, steps.append) == "sha256:" + "a" * 64
    assert steps == ["Step 1/2"]


def test_a_build_error_is_our_error_with_the_builders_words_for_the_operator() -> None:
    events = [{"stream": "Step 1/2 : FROM scratch\n"}, {"errorDetail": {"message": "no such file"}}, {"stream": "x"}]
    with pytest.raises(SandboxError) as caught:
        follow_build(events, lambda _step: None)
    assert (
        caught.value.code == ErrorCode.IMAGE_BUILD_FAILED and caught.value.engine_text == '"no such file"'
    )  # escaped for a terminal


def test_a_listed_containers_creation_time_is_read_as_seconds_and_anything_else_as_unknown(
    engine: DockerEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sweep judges an unlabelled container by its age: a time read as unknown keeps it (never removes it).
    rows = [
        {"Id": "a", "Labels": {"k": "v"}, "State": "running", "Created": 1796378400},
        {"Id": "b", "Labels": None, "State": "exited", "Created": "2026-12-04T10:00:00Z"},
    ]
    monkeypatch.setattr(docker.APIClient, "containers", answering(rows))
    listed = engine.list_containers("k")
    assert [(c.id, dict(c.labels), c.state, c.created) for c in listed] == [
        ("a", {"k": "v"}, "running", 1796378400.0),
        ("b", {}, "exited", None),
    ]
