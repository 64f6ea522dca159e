"""Finding environments: built-in names, the ``pagedrl.envs`` entry-point group, or ``_target_`` paths; and
the Hydra config folders that installed plugins ship.

A plugin may ship its config beside its code: ``conf/env/<name>.yaml`` inside the top-level package of its
entry point (``pagedrl_arith/conf/env/arith.yaml``), with its task source, eval settings and recipe, so that
``python train.py env=<name>`` runs it. ``rl.config.schema`` puts these folders on Hydra's search path.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from envs.base import BaseEnv, EnvError, plugin_name

ENTRY_POINT_GROUP = "pagedrl.envs"
PLUGIN_CONFIG_DIR = "conf"  # inside a plugin's top-level package
BUILTIN_ENVS: dict[str, str] = {
    "sql": "envs.sql.single_turn:SqlEnv",
    "sql_multiturn": "envs.sql.multi_turn:SqlMultiTurnEnv",
}


def available_envs() -> dict[str, str]:
    """Every env name that ``make_env`` accepts, mapped to the object it loads."""
    found = dict(BUILTIN_ENVS)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.value)
    return found


def plugin_config_dirs() -> list[Path]:
    """The ``conf/`` folder inside the top-level package of each installed ``pagedrl.envs`` entry point, where
    there is one (found without importing the plugin), each folder once, in entry-point order."""
    found: list[Path] = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            spec = importlib.util.find_spec(ep.module.partition(".")[0])
        except (ImportError, ValueError):  # a broken plugin is reported when it is picked, not here
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            directory = Path(location) / PLUGIN_CONFIG_DIR
            if directory.is_dir() and directory not in found:
                found.append(directory)
    return found


def plugin_env_config(name: str) -> Path | None:
    """The ``env/<name>.yaml`` that an installed plugin ships, or None."""
    for directory in plugin_config_dirs():
        path = directory / "env" / f"{name}.yaml"
        if path.is_file():
            return path
    return None


def _import_target(target: str) -> Callable[..., Any]:
    module_name, sep, attr = target.partition(":")
    if not sep:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        raise EnvError(f"env target {target!r} is not a dotted path; use 'package.module.ClassName'")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:
        raise EnvError(f"env plugin {target!r} failed to import: {type(exc).__name__}: {exc}") from exc
    return obj


def _resolve(name: str) -> tuple[str, Callable[..., Any]]:
    if name in BUILTIN_ENVS:
        return BUILTIN_ENVS[name], _import_target(BUILTIN_ENVS[name])
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            try:
                return ep.value, ep.load()
            except Exception as exc:
                raise EnvError(
                    f"env plugin {name!r} (entry point {ep.value!r} in group {ENTRY_POINT_GROUP!r}) "
                    f"failed to import: {type(exc).__name__}: {exc}"
                ) from exc
    if "." in name or ":" in name:
        return name, _import_target(name)
    names = ", ".join(sorted(available_envs()))
    raise EnvError(
        f"unknown env {name!r}. Available: {names}. Install a plugin that declares an entry point in group "
        f"{ENTRY_POINT_GROUP!r}, or pass a dotted path such as 'mypackage.envs.MyEnv'."
    )


def make_env(spec: str | Mapping[str, Any], **kwargs: Any) -> BaseEnv:
    """Build an env from a name, a dotted path, or a mapping with ``name``/``_target_`` and flat kwargs. What
    the plugin builds must be a ``BaseEnv`` with its ``max_turns`` set, and comes back as it was built."""
    if isinstance(spec, Mapping):
        kwargs = {**{k: v for k, v in spec.items() if k not in ("name", "_target_")}, **kwargs}
        name = spec.get("_target_") or spec.get("name")
        if not isinstance(name, str):
            raise EnvError(f"env spec {dict(spec)!r} needs a 'name' or a '_target_' string")
    else:
        name = spec
    target, factory = _resolve(name)
    try:
        env = factory(**kwargs)
    except Exception as exc:
        raise EnvError(
            f"env plugin {name!r} ({target}) failed to construct with arguments {sorted(kwargs)}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(env, BaseEnv):
        raise EnvError(
            f"env plugin {name!r} ({target}) built {plugin_name(env)}, which is not an envs.BaseEnv: an env "
            "subclasses envs.BaseEnv, sets 'max_turns' and defines 'start(task)'"
        )
    if not hasattr(env, "max_turns"):
        raise EnvError(
            f"env plugin {name!r} ({target}) built {plugin_name(env)}, which has no 'max_turns': set it on "
            "the class or in __init__ (the most turns an episode takes)"
        )
    return env
