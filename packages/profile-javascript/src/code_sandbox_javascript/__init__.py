"""The ``javascript-offline`` runtime profile for code-sandbox: Node.js 22, no network, built-in modules only."""
