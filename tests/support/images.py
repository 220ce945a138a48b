"""What tests do to images and containers that the product never does (tag, untag, start a created container),
through the Docker adapter's SDK client."""

from __future__ import annotations

import contextlib

import docker.errors
from code_sandbox.docker_engine import DockerEngine


def tag_image(engine: DockerEngine, image_id: str, tag: str) -> None:
    """Point ``tag`` (``repository:tag``) at an existing local image."""
    repository, _, name = tag.rpartition(":")
    engine.client().tag(image_id, repository, name, force=True)


def untag_image(engine: DockerEngine, tag: str) -> None:
    """Remove one tag; the image itself stays while another tag or a container refers to it."""
    with contextlib.suppress(docker.errors.ImageNotFound):
        engine.client().remove_image(tag, force=False, noprune=True)


def start_container(engine: DockerEngine, container_id: str) -> None:
    """Start a container created with ``start=False`` (it then does not remove itself)."""
    engine.client().start(container_id)
