"""The one hook a profile plugin implements, to hand core its :class:`~code_sandbox.profile.Profile` objects.

A plugin is a module registered under the entry-point group ``code_sandbox`` (``[project.entry-points.code_sandbox]``
in its ``pyproject.toml``). Plugins provide *things*, not reactions, so there is one coarse registration hook and
core picks among the registered profiles by name, as simonw/llm registers models.
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

from code_sandbox.profile import Profile

PROJECT = "code_sandbox"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def code_sandbox_register_profiles(register: Callable[[Profile], None]) -> None:
    """Register the profiles this plugin provides.

    :param register: call it once per profile with an instance of a :class:`~code_sandbox.profile.Profile`
        subclass; two profiles with one name is an error.
    :return: nothing; profiles are given through ``register``.
    """
