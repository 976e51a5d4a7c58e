"""The plugin manager: builtins first, then setuptools entry points (group ``gage_eval``)."""
from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import pluggy

from gage_eval.api import hookspecs, registered
from gage_eval.api.errors import GageError, did_you_mean, fault_text
from gage_eval.api.options import RunOption

ENTRY_POINT_GROUP = "gage_eval"
BUILTIN = "builtin"
BUILTIN_MODULE = "gage_plugins_builtin"
KINDS = ("loaders", "preprocessors", "backends", "judges", "metrics", "writers", "executors", "sandboxes",
         "tool_parsers", "tools")


def _unknown_args(factory: Any, kwargs: dict) -> str | None:
    """The arguments ``factory`` takes no parameter for, and those it takes (Python's words were
    '__init__() got an unexpected keyword argument'); None when there is none or it takes any."""
    import inspect

    try:
        params = inspect.signature(factory).parameters.values()  # (a lazy factory: its __wrapped__)
    except (TypeError, ValueError):
        return None
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [k for k in kwargs if k not in named]
    if not unknown or any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    listing = ", ".join(repr(k) + did_you_mean(k, named) for k in unknown)
    return f"unknown argument(s) {listing}; it takes {', '.join(named) or 'none'}"


def _one(kind: str) -> str:
    """``sandboxes`` -> ``sandbox``, ``loaders`` -> ``loader``."""
    return kind[:-2] if kind.endswith("xes") else kind[:-1]


@dataclass(frozen=True)
class Registered:
    name: str
    factory: Callable[..., Any]
    plugin: str
    default: bool = False  # a writer every run gets without naming it (register(..., default=True))


@dataclass(frozen=True)
class RegisteredSchema:
    """A schema a plugin registered: its file and the checks JSON Schema cannot express."""

    name: str
    path: str
    plugin: str
    checks: Callable[[Any], list] | None = None
    warnings: Callable[[Any], list] | None = None
    rows: Callable[[], Any] | None = None


@dataclass(frozen=True)
class RegisteredOption:
    option: RunOption
    plugin: str


@dataclass
class Registry:
    """Everything the loaded plugins registered, with the plugin that registered it."""

    loaders: dict[str, Registered] = field(default_factory=dict)
    preprocessors: dict[str, Registered] = field(default_factory=dict)
    backends: dict[str, Registered] = field(default_factory=dict)
    judges: dict[str, Registered] = field(default_factory=dict)
    metrics: dict[str, Registered] = field(default_factory=dict)
    writers: dict[str, Registered] = field(default_factory=dict)
    executors: dict[str, Registered] = field(default_factory=dict)  # --executor NAME (gage_eval.engine.executor)
    sandboxes: dict[str, Registered] = field(default_factory=dict)  # where generated code runs
    tool_parsers: dict[str, Registered] = field(default_factory=dict)  # --model-args tool_parser=NAME
    tools: dict[str, Registered] = field(default_factory=dict)  # request.tool_loop.tools of a task
    schemas: dict[str, RegisteredSchema] = field(default_factory=dict)
    task_paths: list[tuple[str, str]] = field(default_factory=list)
    data_packages: dict[str, Registered] = field(default_factory=dict)  # name -> root (a folder or a function)
    options: dict[str, RegisteredOption] = field(default_factory=dict)  # run options by key

    def get(self, kind: str, name: str) -> Registered:
        table: dict[str, Registered] = getattr(self, kind)
        if name not in table:
            known = ", ".join(sorted(table)) or "none"
            raise GageError(f"unknown {_one(kind)} {name!r}{did_you_mean(name, table)}; registered {kind}: {known}")
        return table[name]

    def build(self, kind: str, name: str, where: str, key: str | None = None, /, **kwargs: Any) -> Any:
        """A loader, preprocessor, metric or judge from its registered factory. An unknown name or
        bad arguments become a GageError prefixed by ``where`` (and the task file's ``key`` when
        given). Positional-only, so a component argument may itself be called name, kind or key
        (docvqa's hf loader takes ``name``)."""
        at = f"{where}: key '{key}'" if key else where
        try:
            factory = self.get(kind, name).factory
        except GageError as exc:
            raise GageError(f"{at}: {exc}") from None
        try:
            return factory(**kwargs)
        except GageError as exc:  # the component's own message names what is wrong (a missing data file, ...)
            raise GageError(f"{where}: {exc}") from None
        except (TypeError, ValueError) as exc:
            exc = _unknown_args(factory, kwargs) or exc
            raise GageError(f"{at} ({name!r}): {exc}" if key else f"{where}: {_one(kind)} {name!r}: {exc}") from None

    def by_plugin(self) -> dict[str, dict[str, list[str]]]:
        out: dict[str, dict[str, list[str]]] = {}
        for kind in KINDS:
            for reg in getattr(self, kind).values():
                out.setdefault(reg.plugin, {}).setdefault(kind, []).append(reg.name)
        for reg in self.schemas.values():
            out.setdefault(reg.plugin, {}).setdefault("schemas", []).append(reg.name)
        for plugin, path in self.task_paths:
            out.setdefault(plugin, {}).setdefault("task_paths", []).append(path)
        for reg in self.options.values():
            out.setdefault(reg.plugin, {}).setdefault("options", []).append(reg.option.key)
        return out


_pm: pluggy.PluginManager | None = None
_registry: Registry | None = None
failed_plugins: dict[str, str] = {}  # entry points that failed to load -> why, one line (summary.json run.versions)


def _disabled() -> set[str]:
    raw = os.environ.get("GAGE_EVAL_DISABLE_PLUGINS", "")
    return {name.strip() for name in raw.split(",") if name.strip()}


def _plugin_versions() -> dict[str, str]:
    versions = {}
    for dist in importlib.metadata.distributions():
        for ep in dist.entry_points:
            if ep.group == ENTRY_POINT_GROUP:
                versions[ep.name] = dist.version
    return versions


def make_plugin_manager() -> pluggy.PluginManager:
    """A fresh plugin manager with the builtins and every installed entry point loaded."""
    failed_plugins.clear()
    pm = pluggy.PluginManager("gage_eval")
    pm.add_hookspecs(hookspecs)
    for name in _disabled():
        pm.set_blocked(name)
    if not pm.is_blocked(BUILTIN):
        # loaded by name: the core imports no builtin module (an import-linter contract)
        pm.register(importlib.import_module(BUILTIN_MODULE), name=BUILTIN)
    points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    installed = {BUILTIN, *(ep.name for ep in points)}
    for name in sorted(_disabled() - installed):  # (a typo would disable nothing, silently)
        print(f"gage-eval: warning: GAGE_EVAL_DISABLE_PLUGINS names {name!r}, which is no installed plugin "
              f"(installed: {', '.join(sorted(installed))})", file=sys.stderr)
    for ep in points:
        if ep.name == BUILTIN or pm.is_blocked(ep.name) or pm.has_plugin(ep.name):
            continue
        try:
            module = ep.load()
        except Exception as exc:  # a broken third-party plugin must not break the CLI: the run records it
            from gage_eval.api.secrets import strip_credentials

            why = failed_plugins[ep.name] = " ".join(strip_credentials(fault_text(exc)).split())
            print(f"gage-eval: plugin {ep.name!r} failed to load: {why}", file=sys.stderr)
            continue
        pm.register(module, name=ep.name)
    pm.check_pending()
    return pm


def collect_registry(pm: pluggy.PluginManager) -> Registry:
    """Call every registrar hook and build the registry, refusing duplicate names."""
    registry = Registry()
    for kind in KINDS:
        table: dict[str, Registered] = getattr(registry, kind)
        hook = getattr(pm.hook, f"gage_register_{kind}")
        for impl in hook.get_hookimpls():  # registration order: builtins first
            plugin = pm.get_name(impl.plugin) or repr(impl.plugin)

            def register(name: str, factory: Callable[..., Any], _plugin: str = plugin,
                         _table: dict = table, _kind: str = kind, *, default: bool = False) -> None:
                if default and _kind != "writers":
                    raise GageError(f"plugin {_plugin!r}, {_one(_kind)} {name!r}: default=True is for writers only")
                if name in _table:
                    raise GageError(
                        f"{_one(_kind)} {name!r} is registered by both plugin "
                        f"{_table[name].plugin!r} and plugin {_plugin!r}; disable one with "
                        f"GAGE_EVAL_DISABLE_PLUGINS={_plugin}"
                    )
                _table[name] = Registered(name, factory, _plugin, bool(default))

            _call(impl, plugin, register)
    _collect_schemas(pm, registry)
    _collect_options(pm, registry)
    for impl in pm.hook.gage_register_task_paths.get_hookimpls():
        plugin = pm.get_name(impl.plugin) or repr(impl.plugin)
        _call(impl, plugin, lambda path, _p=plugin: registry.task_paths.append((_p, str(path))))
    for impl in pm.hook.gage_register_data_packages.get_hookimpls():
        plugin = pm.get_name(impl.plugin) or repr(impl.plugin)

        def register_package(name: str, root: Any, _plugin: str = plugin) -> None:
            if name in registry.data_packages:
                raise GageError(f"data package {name!r} is registered by both plugin "
                                f"{registry.data_packages[name].plugin!r} and plugin {_plugin!r}; disable one "
                                f"with GAGE_EVAL_DISABLE_PLUGINS={_plugin}")
            registry.data_packages[name] = Registered(name, root, _plugin)

        _call(impl, plugin, register_package)
    return registry


def _call(impl: Any, plugin: str, register: Callable[..., Any]) -> None:
    """Call one registrar; an exception of the plugin's own is its error, named, not gage-eval's."""
    try:
        impl.function(register=register)
    except GageError:
        raise
    except Exception as exc:
        raise GageError(f"plugin {plugin!r} failed in {impl.function.__name__}: {type(exc).__name__}: {exc}; "
                        f"disable it with GAGE_EVAL_DISABLE_PLUGINS={plugin}") from exc


# gage_eval.api.schemas owns these names
CORE_SCHEMAS = ("sample", "instance", "task", "summary", "instance_0.3.0", "aggregate_0.3.0")


def _collect_schemas(pm: pluggy.PluginManager, registry: Registry) -> None:
    for impl in pm.hook.gage_register_schemas.get_hookimpls():
        plugin = pm.get_name(impl.plugin) or repr(impl.plugin)

        def register(name: str, path: Any, checks: Callable[[Any], list] | None = None,
                     warnings: Callable[[Any], list] | None = None, rows: Callable[[], Any] | None = None,
                     _plugin: str = plugin) -> None:
            if name in CORE_SCHEMAS:
                raise GageError(f"plugin {_plugin!r} registers schema {name!r}, a name of gage-eval's own "
                                f"schemas ({', '.join(CORE_SCHEMAS)}); choose another name")
            if name in registry.schemas:
                raise GageError(f"schema {name!r} is registered by both plugin {registry.schemas[name].plugin!r} "
                                f"and plugin {_plugin!r}; disable one with GAGE_EVAL_DISABLE_PLUGINS={_plugin}")
            for what, fn in (("checks", checks), ("warnings", warnings), ("rows", rows)):
                if fn is not None and not callable(fn):
                    raise GageError(f"plugin {_plugin!r}, schema {name!r}: {what} must be a function, "
                                    f"not {type(fn).__name__}")
            registry.schemas[name] = RegisteredSchema(name, str(path), _plugin, checks, warnings, rows)

        _call(impl, plugin, register)


def _collect_options(pm: pluggy.PluginManager, registry: Registry) -> None:
    owners: dict[str, str] = {}  # each key and command-line spelling -> the plugin that declared it
    for impl in pm.hook.gage_register_options.get_hookimpls():
        plugin = pm.get_name(impl.plugin) or repr(impl.plugin)

        def register(key: str, *flags: str, _plugin: str = plugin, **fields: Any) -> None:
            try:
                option = RunOption(key, tuple(flags), **fields)
            except (TypeError, ValueError) as exc:
                raise GageError(f"plugin {_plugin!r}: run option {key!r}: {exc}") from None
            for name in (key, *option.spellings()):
                if name in owners:
                    raise GageError(f"run option {name!r} is registered by both plugin {owners[name]!r} and plugin "
                                    f"{_plugin!r}; disable one with GAGE_EVAL_DISABLE_PLUGINS={_plugin}")
            owners.update(dict.fromkeys((key, *option.spellings()), _plugin))
            registry.options[key] = RegisteredOption(option, _plugin)

        _call(impl, plugin, register)


def load_plugins() -> tuple[pluggy.PluginManager, Registry]:
    """Load plugins once per process; later calls return the same objects."""
    global _pm, _registry
    if _pm is None:
        pm = make_plugin_manager()
        _registry = collect_registry(pm)
        _pm = pm
    assert _registry is not None
    return _pm, _registry


def stored_option_keys() -> list[str]:
    """The config.json keys of the loaded plugins' run options (for reading a stored run's settings)."""
    return [key for key, reg in load_plugins()[1].options.items() if reg.option.stored]


def register_plugin(plugin: object, name: str) -> Registry:
    """Register an in-process plugin (a module or object with hookimpls) and rebuild the registry."""
    global _registry
    pm, _ = load_plugins()
    if pm.is_blocked(name):
        raise GageError(f"plugin {name!r} is disabled by GAGE_EVAL_DISABLE_PLUGINS")
    pm.register(plugin, name=name)
    try:
        _registry = collect_registry(pm)
    except GageError:
        pm.unregister(name=name)
        raise
    return _registry


def reset_plugins() -> None:
    """Forget the loaded plugins (tests, and after installing a plugin in-process)."""
    global _pm, _registry
    _pm = None
    _registry = None


def plugin_versions() -> dict[str, str]:
    return _plugin_versions()


def installed_data_packages() -> list[tuple[str, str]]:
    """The registered data packages that are installed, as ``(name, folder)`` in registration order
    (builtins first): :func:`gage_eval.api.schemas.data_packages`."""
    from gage_eval.api.schemas import data_packages

    return data_packages()


# the API reads what plugins registered (schemas, data packages, sandboxes, tools) through this
# (the API imports nothing above it)
registered.use_registry(lambda: load_plugins()[1])
