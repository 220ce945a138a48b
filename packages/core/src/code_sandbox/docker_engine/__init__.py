"""The Docker adapter: :class:`DockerEngine`, the :class:`~code_sandbox.engine.Engine` on the docker SDK, for Docker
and for Podman's Docker-compatible API. The only package that imports the SDK; one module per concern: the engine's
address, its answers' models, error translation, the SDK's private parts, create arguments, Podman's differences and
its volumes, execs and their streams, image builds and exports."""

from code_sandbox.docker_engine.address import HTTP_IGNORES_TLS, EngineAddress
from code_sandbox.docker_engine.arguments import build_create_arguments
from code_sandbox.docker_engine.engine import DockerEngine

__all__ = ["HTTP_IGNORES_TLS", "DockerEngine", "EngineAddress", "build_create_arguments"]
