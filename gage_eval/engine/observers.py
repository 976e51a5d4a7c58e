"""The observer hooks (gage_run_start, gage_sample_done, gage_task_done, gage_run_end) as a run
calls them: each observer gets its own copy of the event, and one that fails is left out."""
from __future__ import annotations

import sys
from typing import Any, Callable

from gage_eval.api.errors import PLUGIN_FAULTS, fault_text
from gage_eval.api.events import plugin_copy


class Observers:
    """Each observer in turn, with its own copy of the event (what it changes reaches no file,
    count or exit status). One that raises, or calls ``sys.exit``, is reported once and its
    plugin's observers are left out for the rest of the run; the others still hear every event.
    Ctrl-C and SIGTERM raised in one still stop the run."""

    def __init__(self, pm: Any, clean: Callable[[str], str]):
        self.pm = pm
        self.clean = clean
        self.dropped: set[str] = set()  # plugins whose observers failed
        self._impls: dict[str, list] = {}  # hook -> its implementations (plugins do not change mid-run)

    def impls(self, hook: str) -> list:
        impls = self._impls.get(hook)
        if impls is None:  # pluggy's order: the newest plugin first
            impls = self._impls[hook] = [i for i in reversed(getattr(self.pm.hook, hook).get_hookimpls())
                                         if self._name(i) not in self.dropped]
        return impls

    def notify(self, hook: str, event: Any) -> None:
        for impl in list(self.impls(hook)):
            plugin = self._name(impl)
            if plugin in self.dropped:
                continue
            try:
                impl.function(event=plugin_copy(event))
            except PLUGIN_FAULTS as exc:  # an observer must not break a run nor choose its exit status
                self._drop(plugin)
                print(f"gage-eval: warning: observer hook {hook} of plugin {plugin!r} failed: "
                      f"{self.clean(fault_text(exc))}; its observers are left out for the rest of the run",
                      file=sys.stderr)

    def _name(self, impl: Any) -> str:
        return self.pm.get_name(impl.plugin) or impl.plugin_name

    def _drop(self, plugin: str) -> None:
        self.dropped.add(plugin)
        for hook, impls in self._impls.items():
            self._impls[hook] = [i for i in impls if self._name(i) != plugin]
