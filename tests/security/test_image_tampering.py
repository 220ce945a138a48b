"""A hostile image tagged as ours: verify-image refuses it, and a container made from it anyway starts exactly as
ours do (our entrypoint, our environment, no health check) and leaves no volume behind."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterator

import docker.errors
import pytest
from code_sandbox.channel.transport import runtime_argv
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.engine import ExecRequest
from code_sandbox.hardening import PROBE_UID, ContainerRequest, user_of
from code_sandbox.image import FILES_LABEL, verify_image
from code_sandbox.profile import Profile

from tests.support.inspect import inspect_container
from tests.support.own_tag import Variant, variant_of
from tests.support.run import worker_tag

pytestmark = pytest.mark.docker

EVIL = b"process.stdout.write('EVIL LOADED\\n');\n"
SHIM = b"require('child_process').spawnSync(process.argv[2], process.argv.slice(3), { stdio: 'inherit' });\n"


@pytest.fixture
def variant(engine: DockerEngine, profile: Profile, image_id: str) -> Iterator[Variant]:
    with variant_of(engine, profile, image_id, f"code-sandbox-test-hostile:{worker_tag()}") as variant:
        yield variant


@pytest.mark.parametrize(
    ("tail", "files", "failing"),
    [
        ('ENV NODE_OPTIONS="--require /opt/sandbox/evil.js"\nCOPY evil.js /opt/sandbox/evil.js', {"evil.js": EVIL},
         {"config", "files"}),
        ('ENTRYPOINT ["/usr/local/bin/node", "/opt/sandbox/shim.js"]\nCOPY shim.js /opt/sandbox/shim.js',
         {"shim.js": SHIM}, {"config", "files"}),
        ('HEALTHCHECK --interval=1s CMD ["/usr/local/bin/node", "-e", "0"]', {}, {"config"}),
        ("VOLUME /workspace/cache", {}, {"config"}),
        ('CMD ["/usr/local/bin/node", "-e", "0"]', {}, {"config"}),
        ("EXPOSE 8080", {}, {"config"}),
        ("ONBUILD COPY . /", {}, {"config"}),
        ("STOPSIGNAL SIGKILL", {}, {"config"}),
        ("ENV LD_PRELOAD=/opt/sandbox/x.so", {}, {"config"}),
        ('LABEL org.example.extra="1"', {}, {"labels"}),
        ("COPY extra.txt /etc/extra.txt", {"extra.txt": b"nothing to see\n"}, {"files"}),
        ("COPY passwd /etc/passwd", {"passwd": b"root:x:0:0::/:/nonexistent\n"}, {"files", "users and groups"}),
        (f'LABEL {FILES_LABEL}=""', {}, {"files"}),
    ],
    ids=["node-options-require", "entrypoint-shim", "healthcheck", "volume", "cmd", "expose", "onbuild", "stopsignal",
         "ld-preload", "extra-label", "extra-file", "changed-passwd", "manifest-blanked"],
)  # fmt: skip
def test_verify_image_refuses_a_hostile_derived_image(
    variant: Variant, tail: str, files: dict[str, bytes], failing: set[str]
) -> None:
    variant.build(tail, files)
    assert variant.failed_checks() == failing


def test_a_container_of_a_hostile_image_starts_as_ours_and_leaves_no_volume(
    variant: Variant, engine: DockerEngine, profile: Profile
) -> None:
    variant.build(
        'ENV NODE_OPTIONS="--require /opt/sandbox/evil.js" LD_PRELOAD=/nonexistent.so\n'
        'ENTRYPOINT ["/usr/local/bin/node", "/opt/sandbox/shim.js"]\n'
        'HEALTHCHECK --interval=1s CMD ["/usr/local/bin/node", "-e", "0"]\n'
        "VOLUME /cache\n"
        "COPY . /opt/sandbox/",
        {"evil.js": EVIL, "shim.js": SHIM},
    )
    assert not verify_image(engine, variant.profile).passed
    facts = engine.image_facts(variant.profile.image_spec().tag)
    assert facts is not None and "NODE_OPTIONS" in facts.config.env_names
    watchdog = runtime_argv(engine, profile, [*profile.helper_argv("watchdog"), "60"])
    request = ContainerRequest(
        facts.id, watchdog, {}, engine.daemon_facts().apparmor, image_environment=facts.config.env_names
    )
    container_id = engine.create_container(request)
    volumes: list[str] = []
    try:
        inspected = inspect_container(engine, container_id)
        assert [inspected["Path"], *inspected["Args"]] == watchdog
        assert inspected["Config"]["Healthcheck"]["Test"] == ["NONE"] and "Health" not in inspected["State"]
        env = dict(entry.partition("=")[::2] for entry in inspected["Config"]["Env"])
        assert env["NODE_OPTIONS"] == env["LD_PRELOAD"] == ""
        volumes = [mount["Name"] for mount in inspected["Mounts"] if mount["Type"] == "volume"]
        assert len(volumes) == 1  # the image's VOLUME made one: it must go with the container
        probe = "console.log(JSON.stringify([process.env.NODE_OPTIONS, process.env.LD_PRELOAD]))"
        result = engine.exec(
            container_id,
            ExecRequest(
                runtime_argv(engine, profile, ["/usr/local/bin/node", "-e", probe]),
                user=user_of(PROBE_UID),
                timeout=30,
                max_stdout=4096,
            ),
        )
        assert result.exit_code == 0 and json.loads(result.stdout) == ["", ""]
        assert b"EVIL" not in result.stdout
    finally:
        engine.remove_container(container_id)
    with pytest.raises(docker.errors.NotFound):
        engine.client().inspect_volume(volumes[0])


def test_a_forged_manifest_does_not_hide_what_the_host_knows_itself(
    variant: Variant, engine: DockerEngine, image_id: str
) -> None:
    # Whoever rewrites the manifest label along with the files passes the files row; the users and groups, owners and
    # modes are checked against what the host knows, whatever the labels say.
    good = engine.image_facts(image_id)
    assert good is not None
    passwd = b"root:x:0:0::/:/nonexistent\nsupervisor:x:65533:65533::/:/nonexistent\nsandbox:x:1879048192:0::/:/x\n"
    lines = [line for line in good.labels[FILES_LABEL].split("\n") if not line.endswith(" /etc/passwd")]
    lines += [f"file 0444 0:0 {hashlib.sha256(passwd).hexdigest()} /etc/passwd"]
    lines += [f"file 4555 0:0 {hashlib.sha256(SHIM).hexdigest()} /opt/sandbox/shim.js"]
    manifest = "\n".join(sorted(lines))
    forged = _tar([("etc/passwd", passwd, 0o444), ("opt/sandbox/shim.js", SHIM, 0o4555)])  # ADD keeps setuid
    context = _tar(
        [("Dockerfile", f"FROM {image_id}\nADD forged.tar /\n".encode(), 0o444), ("forged.tar", forged, 0o444)]
    )
    tag = variant.profile.image_spec().tag
    engine.build_image(io.BytesIO(context), tag=tag, labels={FILES_LABEL: manifest}, on_step=lambda _step: None)
    failed = variant.failed_checks()
    assert "files" not in failed  # the forgery holds as far as labels go
    assert {"users and groups", "owners and modes"} <= failed


def _tar(members: list[tuple[str, bytes, int]]) -> bytes:
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, data, mode in members:
            entry = tarfile.TarInfo(name)
            entry.size, entry.mode = len(data), mode
            tar.addfile(entry, io.BytesIO(data))
    return archive.getvalue()
