"""Finding the installed profiles and selecting the one to serve.

Nothing outside this module touches ``pm.hook``: the rest of core holds the selected
:class:`~code_sandbox.profile.Profile` object and calls its typed methods.
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from code_sandbox import hookspecs
from code_sandbox.channel.protocol import PROTOCOL_VERSION
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.profile import Profile, ProfileInfo

ENTRY_POINT_GROUP = "code_sandbox"


def create_plugin_manager(*, load_entry_points: bool = True, plugins: Iterable[object] = ()) -> pluggy.PluginManager:
    """Build a plugin manager with core's hookspecs, the installed profile plugins and any extra ``plugins``.

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


def _profile_error(message: str, hint: str) -> SandboxError:
    return SandboxError(ErrorCode.PROFILE_ERROR, message, hint=hint)


def installed_profiles(pm: pluggy.PluginManager) -> dict[str, Profile]:
    """Every profile the plugins register, by name.

    :raises SandboxError: ``PROFILE_ERROR`` when a plugin registers something that is not a well-formed profile,
        or two profiles share a name.
    """
    found: dict[str, Profile] = {}

    def register(profile: object) -> None:
        # A plugin is third-party code: check what it hands over instead of trusting its annotations.
        info = getattr(profile, "info", None)
        if not isinstance(profile, Profile) or not isinstance(info, ProfileInfo):
            raise _profile_error("a plugin registered something that is not a profile", "reinstall the plugin")
        if info.name in found:
            raise _profile_error(f"two plugins register a profile named {info.name!r}", "uninstall one of them")
        found[info.name] = profile

    pm.hook.code_sandbox_register_profiles(register=register)
    return found


def select_profile(pm: pluggy.PluginManager, wanted: str | None) -> Profile:
    """Pick the profile to serve: the only one installed, or the one ``CODE_SANDBOX_PROFILE`` names.

    :param pm: a manager from :func:`create_plugin_manager`.
    :param wanted: the configured profile name, or ``None``.
    :raises SandboxError: ``PROFILE_ERROR`` when none is installed, several are and none is named, the named one is
        not installed, or it speaks another version of the helper protocol than this core.
    """
    found = installed_profiles(pm)
    if not found:
        raise _profile_error("no runtime profile is installed", "install a profile, for example: uv sync --frozen")
    if wanted is None:
        if len(found) > 1:
            raise _profile_error(
                f"several runtime profiles are installed ({', '.join(sorted(found))}); "
                "set CODE_SANDBOX_PROFILE to one of them",
                "export CODE_SANDBOX_PROFILE=<name>",
            )
        wanted = next(iter(found))
    if wanted not in found:
        raise _profile_error(
            f"CODE_SANDBOX_PROFILE names a profile that is not installed; installed: {', '.join(sorted(found))}",
            "set CODE_SANDBOX_PROFILE to an installed profile, or unset it",
        )
    profile = found[wanted]
    if profile.info.protocol_version != PROTOCOL_VERSION:
        raise _profile_error(
            f"the profile {wanted!r} speaks helper protocol {profile.info.protocol_version}, "
            f"this code-sandbox speaks {PROTOCOL_VERSION}",
            "install matching versions of code-sandbox and the profile",
        )
    return profile
