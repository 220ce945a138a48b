// The reference SDK's own client (@modelcontextprotocol/sdk), driven by a plan. It starts the server named on its
// command line over stdio, lists the tools (which readies the SDK's output-schema validators, as a real client's
// first list does), then makes each call of the plan read from stdin (a JSON array of {"name", "arguments"}) and
// prints one JSON line per call: {"result": ...} as callTool returned it, or {"thrown": {"code", "message"}} when
// callTool threw. The string "$session_id" in arguments stands for the session_id of the latest result that had one.
// The SDK is imported from the directory in SDK_DIR (the pinned install of tests/support/clients).
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const sdk = (relative) => import(pathToFileURL(path.join(process.env.SDK_DIR, 'dist/esm', relative)).href);
const { Client } = await sdk('client/index.js');
const { StdioClientTransport } = await sdk('client/stdio.js');

const [command, ...args] = process.argv.slice(2);
const plan = JSON.parse(fs.readFileSync(0, 'utf8'));
const transport = new StdioClientTransport({ command, args, env: process.env, stderr: 'ignore' });
const client = new Client({ name: 'code-sandbox-tests', version: '0.0.0' });
await client.connect(transport);
const listed = await client.listTools();
process.stdout.write(`${JSON.stringify({ listed: listed.tools.map((tool) => tool.name) })}\n`);
let session = null;
const fill = (value) => {
  if (value === '$session_id') return session;
  if (Array.isArray(value)) return value.map(fill);
  if (value && typeof value === 'object') return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, fill(v)]));
  return value;
};
for (const call of plan) {
  try {
    const result = await client.callTool({ name: call.name, arguments: fill(call.arguments ?? {}) });
    if (result.structuredContent?.session_id) session = result.structuredContent.session_id;
    process.stdout.write(`${JSON.stringify({ result })}\n`);
  } catch (error) {
    process.stdout.write(`${JSON.stringify({ thrown: { code: error.code ?? null, message: String(error.message) } })}\n`);
  }
}
await client.close();
