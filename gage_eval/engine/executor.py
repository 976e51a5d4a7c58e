"""Where the model runs: in this process (``--executor local``, the default, the core's own) or
through an executor a plugin registers (``gage_register_executors``; the builtin plugin's
``ray``), looked up by name; the backends built from the registry, and wrapped by the plugins
(``gage_wrap_backend``)."""
from __future__ import annotations

from functools import partial
from typing import Any, Mapping

from gage_eval.api.backend import Backend
from gage_eval.api.errors import GageError
from gage_eval.api.running import BackendUse, Tally
from gage_eval.engine.replies import reusable
from gage_eval.plugins import Registry

LOCAL = "local"


def make_backend(registry: Registry, name: str, args: Mapping[str, Any], batch_size: Any, seed: int) -> Backend:
    factory = registry.get("backends", name).factory
    kwargs = dict(args)
    if batch_size is not None:
        kwargs.setdefault("batch_size", batch_size)
    kwargs.setdefault("seed", seed)
    try:
        return factory(**kwargs)
    except TypeError as exc:
        raise GageError(f"backend {name!r}: bad arguments: {exc}") from None


def build_backend(name: str, args: Mapping[str, Any], batch_size: Any, seed: int) -> Backend:
    """The backend ``name`` built from this process's plugins (loaded here when not yet): what an
    executor's worker in another process calls (picklable by reference)."""
    from gage_eval.plugins import load_plugins

    return make_backend(load_plugins()[1], name, args, batch_size, seed)


def executor_names(registry: Registry) -> list[str]:
    return [LOCAL, *registry.executors]


def executor(registry: Registry, name: str) -> Any:
    """The registered executor ``name`` (None: ``local``); an unknown name lists the known ones."""
    if name == LOCAL:
        return None
    if name not in registry.executors:
        raise GageError(f"--executor: expected one of {', '.join(executor_names(registry))}, not {name!r}")
    return registry.executors[name].factory()


def placement_args(registry: Registry, placement: bool = False) -> tuple[str, ...]:
    """Every registered executor's ``model_args`` (with ``placement``: its ``placement_args``,
    every key that says where the model runs): taken out where runs compare model args."""
    keys: dict[str, None] = {}
    for reg in registry.executors.values():
        ex = reg.factory()
        keys.update(dict.fromkeys(getattr(ex, "model_args", ())))
        if placement:
            keys.update(dict.fromkeys(getattr(ex, "placement_args", ()) or ()))
    return tuple(keys)


def split_args(registry: Registry, args: Mapping[str, Any], name: str, options: Mapping[str, Any] | None = None,
               where: str = "--model-args") -> tuple[dict, Any]:
    """The backend's own arguments, and the executor's plan (None in this process). A local run
    given what only a registered executor takes (its model args, its options) is refused with
    that executor's message."""
    ex = executor(registry, name)
    if ex is not None:
        return ex.plan(args, where)
    for reg in registry.executors.values():
        refused = reg.factory().refusal(args, options or {}, where)
        if refused:
            raise GageError(refused)
    return dict(args), None


def model_backend(registry: Registry, name: str, args: Mapping[str, Any], batch_size: Any, seed: int,
                  executor_name: str, options: Mapping[str, Any]) -> Backend:
    """The model's backend where ``executor_name`` runs it: built here, handed to the executor."""
    args, plan = split_args(registry, args, executor_name, options)
    proto = make_backend(registry, name, args, batch_size, seed)
    if plan is None:
        return proto
    build = partial(build_backend, name, dict(args), batch_size, seed)
    return executor(registry, executor_name).backend(proto, name, build, plan, options)


def wrap_backends(pm: Any, opts: Any, secrets: tuple[str, ...], tally: Tally, backends: tuple[Backend, Backend],
                  ready: list) -> tuple[dict[str, Backend], list]:
    """The backend each stage sends its requests to (``model``; ``judge`` when a task of
    ``ready`` is judged): the role's backend as the plugins wrap it (``gage_wrap_backend``,
    builtins innermost), and every wrapper put around them (closed at the end of the run)."""
    settings = opts.as_dict()
    roles = {"model": (backends[0], opts.model)}
    tool_loops = any(getattr(tr, "builder", None) is not None and tr.builder.tool_loop for tr in ready)
    if any(tr.judge for tr in ready):
        roles["judge"] = (backends[1], opts.judge_model or opts.model)
    staged, layers = {}, []
    for role, (b, name) in roles.items():
        use = BackendUse(role, name, opts.seed, secrets, settings,
                         lambda request, out: reusable(request, out, secrets), tally, tool_loops)
        for impl in pm.hook.gage_wrap_backend.get_hookimpls():  # registration order
            wrapped = impl.function(backend=b, use=use)
            if wrapped is not None:
                layers.append(wrapped)
                b = wrapped
        staged[role] = b
    return staged, layers
