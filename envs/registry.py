"""Finding environments: built-in names, the ``pagedrl.envs`` entry-point group, or ``_target_`` paths."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

from envs.base import Env, EnvError, plugin_name

ENTRY_POINT_GROUP = "pagedrl.envs"
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


def make_env(spec: str | Mapping[str, Any], **kwargs: Any) -> Env:
    """Build an env from a name, a dotted path, or a mapping with ``name``/``_target_`` and flat kwargs."""
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
    if not isinstance(env, Env):
        raise EnvError(
            f"env plugin {name!r} ({target}) built {plugin_name(env)}, which is not an Env: it needs a "
            "'max_turns' attribute and a 'start(task)' method"
        )
    return env
