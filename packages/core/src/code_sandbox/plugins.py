"""The plugin manager factory and :class:`Profile`, the typed facade over the selected profile's hooks.

Nothing outside this module touches ``pm.hook``: the rest of core asks a :class:`Profile` and gets typed answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TypeVar, cast

import pluggy

from code_sandbox import hookspecs
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hookspecs import HelperKind, ImageContents, ImageSpec, ProfileInfo

ENTRY_POINT_GROUP = "code_sandbox"
_T = TypeVar("_T")


def create_plugin_manager(*, load_entry_points: bool = True, plugins: Iterable[object] = ()) -> pluggy.PluginManager:
    """Build a plugin manager with core's hookspecs, the installed profiles and any extra ``plugins``.

    :param load_entry_points: load plugins from the ``code_sandbox`` entry-point group.
    :param plugins: extra plugin objects to register (tests use this for inline profiles).
    :return: a manager whose every registered hook implementation matches a spec.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    if load_entry_points:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    for plugin in plugins:
        pm.register(plugin)
    pm.check_pending()
    return pm


class Profile:
    """The selected runtime profile: its identity plus typed calls into only its own hook implementations."""

    def __init__(self, pm: pluggy.PluginManager, plugin: object, info: ProfileInfo) -> None:
        self._pm = pm
        self._plugin = plugin
        self.info = info

    @property
    def name(self) -> str:
        return self.info.name

    def _call(self, hook_name: str) -> pluggy.HookCaller:
        others = [p for p in self._pm.get_plugins() if p is not self._plugin]
        return self._pm.subset_hook_caller(hook_name, remove_plugins=others)

    def image_spec(self) -> ImageSpec:
        return self._required(self._call("code_sandbox_image_spec")(), "code_sandbox_image_spec", ImageSpec)

    def build_run_argv(self, entrypoint: str, arguments: Sequence[str]) -> list[str]:
        result = self._call("code_sandbox_build_run_argv")(entrypoint=entrypoint, arguments=list(arguments))
        argv = cast(list[object], self._required(result, "code_sandbox_build_run_argv", list))
        return [str(part) for part in argv]

    def helper_argv(self, helper: HelperKind) -> list[str]:
        result = self._call("code_sandbox_helper_argv")(helper=helper)
        argv = cast(list[object], self._required(result, "code_sandbox_helper_argv", list))
        return [str(part) for part in argv]

    def image_contents(self, runtime_binary: Path | None) -> ImageContents:
        result = self._call("code_sandbox_image_contents")(runtime_binary=runtime_binary)
        return self._required(result, "code_sandbox_image_contents", ImageContents)

    def _required(self, value: object, hook_name: str, kind: type[_T]) -> _T:
        if not isinstance(value, kind):
            raise SandboxError(
                ErrorCode.PROFILE_ERROR,
                f"the profile {self.name!r} gave no valid answer to {hook_name}",
                hint="reinstall the profile package",
            )
        return value


def select_profile(pm: pluggy.PluginManager, wanted: str | None) -> Profile:
    """Pick the profile to serve: the only one installed, or the one ``CODE_SANDBOX_PROFILE`` names.

    :param pm: a manager from :func:`create_plugin_manager`.
    :param wanted: the configured profile name, or ``None``.
    :raises SandboxError: ``PROFILE_ERROR`` when none is installed, several are and none is named, or the named
        one is not installed.
    """
    found: dict[str, tuple[object, ProfileInfo]] = {}
    for plugin in pm.get_plugins():
        others = [p for p in pm.get_plugins() if p is not plugin]
        answers = pm.subset_hook_caller("code_sandbox_profile_info", remove_plugins=others)()
        for info in answers:
            if isinstance(info, ProfileInfo):
                found[info.name] = (plugin, info)
    if not found:
        raise SandboxError(
            ErrorCode.PROFILE_ERROR,
            "no runtime profile is installed",
            hint="install a profile, for example: uv sync --frozen",
        )
    if wanted is None:
        if len(found) > 1:
            raise SandboxError(
                ErrorCode.PROFILE_ERROR,
                f"several runtime profiles are installed ({', '.join(sorted(found))}); "
                "set CODE_SANDBOX_PROFILE to one of them",
                hint="export CODE_SANDBOX_PROFILE=<name>",
            )
        wanted = next(iter(found))
    if wanted not in found:
        raise SandboxError(
            ErrorCode.PROFILE_ERROR,
            f"CODE_SANDBOX_PROFILE names a profile that is not installed; installed: {', '.join(sorted(found))}",
            hint="set CODE_SANDBOX_PROFILE to an installed profile, or unset it",
        )
    plugin, info = found[wanted]
    return Profile(pm, plugin, info)
