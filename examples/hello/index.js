// The first program to run in a sandbox: `uv run code-sandbox run examples/hello`.
console.log('Hello from the isolated container');
