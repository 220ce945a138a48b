"""The MCP surface: a stdio server on ``MCPServer``. Tools are thin and call into core."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

from code_sandbox.plugins import Profile
from code_sandbox.settings import Settings

INSTRUCTIONS = """\
Disposable, offline {language} sandboxes. Workflow: create_sandbox -> write_files -> {run_tool} (repeat: fix \
files with write_files overwrite=true and run again) -> destroy_sandbox when done. Sandboxes have no network and \
expire on their own."""


def build_server(settings: Settings, profile: Profile) -> MCPServer:
    """Assemble the MCP server for one profile."""
    del settings
    return MCPServer(
        name="code-sandbox",
        instructions=INSTRUCTIONS.format(language=profile.info.language, run_tool=profile.info.run_tool_name),
        log_level="WARNING",
    )


def run_stdio_server(settings: Settings, profile: Profile) -> None:
    """Serve MCP over stdin/stdout until the client closes stdin."""
    build_server(settings, profile).run("stdio")
