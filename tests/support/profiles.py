"""Profiles as a test needs them: the installed one with a capability switched on or off."""

from __future__ import annotations

import copy
import dataclasses

from code_sandbox.profile import Profile


def with_jailed_runs(profile: Profile, jailed_runs: bool) -> Profile:
    """``profile``, told that its runner can jail its runs under gVisor (or that it cannot): the trust model there is
    then jailed runs (or engine-only)."""
    changed = copy.copy(profile)
    changed.info = dataclasses.replace(profile.info, jailed_runs=jailed_runs)
    return changed
