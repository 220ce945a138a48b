"""The MCP surface: the nine tools (their strict input and output models, what each tells a model, one function a
call that translates it into one service call) and ``serve``'s stdio wire, which judges every client line before the
SDK sees it. The only package that imports the MCP SDK."""
