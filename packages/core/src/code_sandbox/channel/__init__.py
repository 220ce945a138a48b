"""The host-helper channel: the protocol's strict models (defined once for both ends), the typed :class:`Transport`
to a sandbox's helpers, the channel transport that serves them over held execs, and the guard that destroys a
sandbox whose helper broke the protocol."""
