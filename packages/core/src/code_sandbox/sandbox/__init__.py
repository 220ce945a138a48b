"""The sandbox service: one server's sandboxes and everything done in them. The service starts and stops them as one
(sessions and their leases, the warm pool, the provisioner, sweeps, the audit log); runs, evaluations, one-shots and
file operations go through a leased sandbox's channel, supervised, and come back as one result shape. No MCP code."""
