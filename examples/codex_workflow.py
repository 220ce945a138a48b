"""Drive the iterate workflow through the official MCP client over stdio and print a short transcript.

Three files that normalise and deduplicate URLs are written, listed and run; one is overwritten and the program
runs again; the sandbox is destroyed whatever happened. Run it from a checkout after building the image:

    uv run python examples/codex_workflow.py
"""

from __future__ import annotations

import json
import shutil
import sys
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

FILES = {
    "normalize.js": """\
// Lower-case the host, drop default ports, fragments and trailing slashes.
exports.normalize = (raw) => {
  const url = new URL(raw.trim());
  url.hash = '';
  const defaultPort = { 'http:': '80', 'https:': '443' }[url.protocol];
  const port = url.port && url.port !== defaultPort ? `:${url.port}` : '';
  const path = url.pathname.replace(/\\/+$/, '');
  return `${url.protocol}//${url.hostname.toLowerCase()}${port}${path}${url.search}`;
};
""",
    "test-data.js": """\
module.exports = [
  'https://Example.com/docs/',
  'https://example.com:443/docs',
  'http://example.com/about#team',
  'https://EXAMPLE.com/docs#intro',
];
""",
    "index.js": """\
const { normalize } = require('./normalize');
const urls = require('./test-data');
const unique = [...new Set(urls.map(normalize))];
console.log(`${urls.length} URLs, ${unique.length} unique:`);
for (const url of unique) console.log(`  ${url}`);
""",
}


def show(step: str, result: Any) -> dict[str, Any]:
    data: dict[str, Any] = result.structured_content or {}
    status = "error" if result.is_error else "ok"
    print(f"{step:<28} {status}: {result.content[0].text if result.is_error else json.dumps(data)[:110]}")
    return data


async def main() -> None:
    command = shutil.which("code-sandbox") or sys.exit("code-sandbox is not on PATH; run with `uv run`")
    params = StdioServerParameters(command=command, args=["serve"])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        await client.initialize()
        sandbox = show("create_sandbox", await client.call_tool("create_sandbox", {}))
        session_id = sandbox["session_id"]
        try:
            files = [{"path": path, "content": content} for path, content in FILES.items()]
            show(
                "write_files (3 files)",
                await client.call_tool("write_files", {"session_id": session_id, "files": files}),
            )
            show("list_files", await client.call_tool("list_files", {"session_id": session_id}))
            run = {"session_id": session_id, "entrypoint": "index.js"}
            print(show("run_javascript", await client.call_tool("run_javascript", run)).get("stdout", ""), end="")
            fixed = "module.exports = ['https://example.com/docs', 'https://Other.org:8443/x/'];\n"
            update = {
                "session_id": session_id,
                "files": [{"path": "test-data.js", "content": fixed}],
                "overwrite": True,
            }
            show("write_files (overwrite)", await client.call_tool("write_files", update))
            print(
                show("run_javascript (again)", await client.call_tool("run_javascript", run)).get("stdout", ""), end=""
            )
        finally:
            show("destroy_sandbox", await client.call_tool("destroy_sandbox", {"session_id": session_id}))


if __name__ == "__main__":
    anyio.run(main)
