"""``goblin mcp``: the audit's stages as Model Context Protocol tools for coding agents (tools.py: the table;
server.py: the protocol, transports and resources)."""
