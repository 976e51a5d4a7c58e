"""How a run's backends run, as plugins may change it: what the core hands a backend wrapper
(``gage_wrap_backend``: :class:`BackendUse`, with its :class:`Tally`) and the contract of an
executor (``gage_register_executors``: :class:`Executor`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence


class Tally:
    """Per-task counts a backend wrapper keeps, written into summary.json: each task's
    ``tasks.<task>.<section>`` (every declared key, 0 when nothing was counted, then the keys
    counted later in their order) and ``run.<section>`` (``about``, then each key summed over
    the tasks). The core says which task is running (:attr:`task`)."""

    def __init__(self) -> None:
        self.declared: dict[str, tuple[tuple[str, ...], dict]] = {}  # section -> (keys, about)
        self.by_task: dict[str, dict[str, dict[str, int]]] = {}
        self.task: str | None = None

    def declare(self, section: str, keys: Sequence[str] = (), about: Mapping[str, Any] | None = None) -> None:
        """A section every task reports; a second declaration of it adds its keys."""
        old_keys, old_about = self.declared.get(section, ((), {}))
        keys = old_keys + tuple(k for k in keys if k not in old_keys)
        self.declared[section] = (keys, {**old_about, **dict(about or {})})
        for sections in self.by_task.values():
            part = sections.setdefault(section, {})
            for key in keys:
                part.setdefault(key, 0)

    def add(self, section: str, key: str, n: int) -> None:
        """``n`` more of ``key`` in the running task's ``section``."""
        if self.task is not None:
            part = self.of_task(self.task).setdefault(section, {})
            part[key] = part.get(key, 0) + n

    def of_task(self, task: str) -> dict[str, dict[str, int]]:
        """The task's sections, live (the task's summary reads them)."""
        if task not in self.by_task:
            self.by_task[task] = {s: dict.fromkeys(keys, 0) for s, (keys, _) in self.declared.items()}
        return self.by_task[task]

    def of_run(self, tasks: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Each declared section for ``run`` in summary.json: its ``about``, then its keys summed."""
        out = {}
        for section, (_, about) in self.declared.items():
            parts = [self.of_task(t).get(section, {}) for t in tasks]
            keys = list(dict.fromkeys(k for part in parts for k in part))
            out[section] = {**about, **{k: sum(part.get(k, 0) for part in parts) for k in keys}}
        return out


@dataclass(frozen=True)
class BackendUse:
    """What the core tells a backend wrapper (``gage_wrap_backend``) about one role of a run.

    ``role``: ``model`` or ``judge`` (the same backend may be wrapped once for each);
    ``name``: the backend's registered name (``--model``, ``--judge-model``); ``seed``: the
    run's; ``secrets``: every secret of the run, masked in whatever it writes; ``options``: the
    run's settings by key, as config.json holds them (the plugins' options among them);
    ``keeps(request, output)``: whether a reply may be kept for reuse: a well-formed
    ModelOutput without an error that quotes no secret (the run writes such a reply masked, so
    a kept copy would give back the mask); ``tally``: per-task counts that reach summary.json;
    ``tool_loops``: whether a task of the run sends requests with a ``tool_loop`` (a wrapper that
    carries out tool loops has nothing to do in a run without).
    """

    role: str
    name: str
    seed: int
    secrets: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)
    keeps: Callable[[Any, Any], bool] = lambda request, output: True
    tally: Tally = field(default_factory=Tally)
    tool_loops: bool = True


class Executor:
    """Where the model runs, other than in this process (``--executor NAME``), registered with
    ``gage_register_executors``. The engine still reads, judges, scores and writes every row
    here; the executor gives it the backend to send the requests to."""

    #: the ``--model-args`` keys it takes (never given to the backend; refused by a local run)
    model_args: tuple[str, ...] = ()
    #: every ``--model-args`` key that says where the model runs, not what it computes (shards
    #: and resumes compare model args without them); default: :attr:`model_args`
    placement_args: tuple[str, ...] = ()

    def plan(self, args: Mapping[str, Any], where: str) -> tuple[dict, Any]:
        """The backend's own arguments, and the executor's plan (any object with ``describe()``,
        a line such as "2 Ray replicas (1 CPU each)"); a bad value raises GageError naming ``where``."""
        return {k: v for k, v in args.items() if k not in self.model_args}, None

    def refusal(self, args: Mapping[str, Any], options: Mapping[str, Any], where: str) -> str | None:
        """The message refusing a run in this process that was given this executor's model args
        (``args``) or options; None when it was given none."""
        given = [k for k in self.model_args if k in args]
        return f"{where}: {', '.join(given)}: they only apply with another --executor" if given else None

    def backend(self, proto: Any, name: str, build: Callable[[], Any], plan: Any,
                options: Mapping[str, Any]) -> Any:
        """The backend the engine uses: ``proto`` is the backend built here (never opened: its
        capabilities, secrets and settings answer before ``open()``), ``name`` its registered
        name, ``build()`` a picklable function building the same backend in another process
        (the plugins loaded there), ``options`` the run's settings by key."""
        raise NotImplementedError
