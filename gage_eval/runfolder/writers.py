"""Output writers: each finished record goes to every writer of the run, as it is written.

The run folder's own files are the core's writers: ``samples/<task>.jsonl`` (the record of
truth, which ``--resume`` reads back) and ``summary.json``. A plugin adds formats with the
``gage_register_writers`` hook (the builtin's ``instances``, Every Eval Ever records, and
``report`` are on by default); a run names the ones it wants with ``--writer NAME[:k=v,...]``.

On ``--resume`` every writer starts each task afresh and first receives the records kept
from before, in their order, so it rebuilds its output whole; it never needs to read back
what it wrote. A plugin writer gets copies (it cannot change the record, the counts or the
summary), unless it declares ``read_only = True`` (it promises not to change them); one that fails, ``sys.exit`` included, is reported once and left out for the rest of
the run: the samples file still holds every record, a resume rebuilds the writer's output, and
``--drop-writer NAME`` resumes without it.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from gage_eval.api.errors import PLUGIN_FAULTS, GageError, OutputError, fault_text, interrupt_reason
from gage_eval.api.events import RunStart, TaskDone, plugin_copy
from gage_eval.config.kv import parse_kv
from gage_eval.api.secrets import REDACTED, is_secret_key
from gage_eval.api.writer import Writer
from gage_eval.api.runfolder import RunFolder
from gage_eval.runfolder.records import recover_jsonl


class SamplesWriter(Writer):
    """``samples/<task>.jsonl``: one line per sample, flushed as it is written."""

    name = "samples"

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.folder = RunFolder(run_dir)
        self._files = self.folder.task_files(self.folder.samples_dir)  # a task that writes no record leaves no file

    def path(self, task: str) -> Path:
        return self.folder.samples_file(task)

    def recover(self, task: str, keep: Callable[[Mapping[str, Any]], bool]) -> Iterator[tuple[dict, bool]]:
        """The records an earlier run of this folder wrote for ``task``, each with ``keep(record)``;
        those not kept (to be run again) are removed from the file."""
        return recover_jsonl(self.path(task), keep)

    def write(self, task: str, record: Mapping[str, Any]) -> None:
        self._files.write(task, record)

    def task_end(self, event: TaskDone) -> None:
        self._files.close(event.task)

    def end(self, summary: Mapping[str, Any]) -> None:
        self._files.close()


class SummaryWriter(Writer):
    """``summary.json``, replaced whole (never half-written)."""

    name = "summary"

    def __init__(self, run_dir: Path):
        self.folder = RunFolder(run_dir)
        self.path = self.folder.summary_file

    def end(self, summary: Mapping[str, Any]) -> None:
        self.folder.write_summary(summary)


def parse_writer(spec: str) -> tuple[str, dict]:
    """``NAME`` or ``NAME:k=v,k2=v2`` as the writer's name and its factory's arguments."""
    name, _, args = str(spec).partition(":")
    if not name.strip():
        raise GageError(f"--writer {spec!r}: expected NAME or NAME:key=value,...")
    return name.strip(), parse_kv(args, f"--writer {name.strip()}")


def writer_secrets(specs: list[str]) -> tuple[str, ...]:
    """The values of secret-looking arguments (``api_key=``, ``token=``, ...) in ``--writer``
    specs: masked wherever the run writes or prints, like a backend's secrets."""
    out = []
    for spec in specs:
        for key, value in parse_writer(spec)[1].items():
            if is_secret_key(key) and value not in (None, "", REDACTED):
                out.append(str(value))
    return tuple(out)


def plugin_writers(registry: Any, specs: list[str], *, merged: bool = False) -> list[Writer]:
    """The plugins' writers of a run, built from the registered factories: first those registered
    with ``default=True`` that the run does not name (with no arguments), then those it names.
    ``merged``: a merged run's, the default writers whose factory declares ``merged = True``."""
    named = [parse_writer(spec) for spec in specs]
    given = {name for name, _ in named}
    defaults = [(name, {}, f"writer {name} (on by default)") for name, reg in registry.writers.items()
                if reg.default and name not in given and (not merged or getattr(reg.factory, "merged", False))]
    out = []
    for name, args, where in defaults + [(name, args, f"--writer {name}") for name, args in named]:
        try:
            writer = registry.build("writers", name, where, None, **args)
        except GageError:
            raise
        except PLUGIN_FAULTS as exc:  # refused before the run starts, as a bad argument is
            raise GageError(f"{where}: its factory failed: {fault_text(exc)}") from None
        for method in ("start", "task_start", "write", "task_end", "end"):
            if not callable(getattr(writer, method, None)):
                raise GageError(f"{where}: its factory returned {type(writer).__name__}, which has no "
                                f"{method}() method (a writer derives from gage_eval.api.Writer)")
        try:
            writer.name = name
        except AttributeError:
            pass
        out.append(writer)
    return out


class WriterSet:
    """The run's writers, fed in order: the core's first (the samples file before anything
    else), then the plugins'. A core writer's failure stops the run (nothing can be kept);
    a plugin writer's is reported once and that writer is dropped."""

    def __init__(self, core: list[Writer], plugins: list[Writer], warn: Callable[[str], None] | None = None):
        self.core = core
        self.plugins = plugins
        self.failed: dict[str, str] = {}  # plugin writer name -> why it was dropped
        self.started = False  # a run stopped before start() (in the model load) ends only the core's
        self._warn = warn or (lambda msg: print(f"gage-eval: warning: {msg}", file=sys.stderr))

    def _each(self, method: str, *args: Any, skip: int = 0) -> None:
        no_op = getattr(Writer, method)  # a writer that keeps the contract's do-nothing default is not called
        for writer in self.core[skip:]:
            call = getattr(writer, method)
            if getattr(call, "__func__", None) is not no_op:
                call(*args)
        for writer in list(self.plugins):
            try:  # each its own copy: what a plugin changes reaches no count, file or other writer
                call = getattr(writer, method)
                if getattr(call, "__func__", None) is not no_op:  # (nor copied for: a copy a record is not free)
                    call(*(args if getattr(writer, "read_only", False) is True else [plugin_copy(a) for a in args]))
            except PLUGIN_FAULTS as exc:  # a bug, a full disk, sys.exit: its output is rebuilt by a resume
                self.plugins.remove(writer)
                why = fault_text(exc)
                self.failed[writer.name] = why
                self._warn(f"writer {writer.name!r} failed in {method}() and is left out for the rest of "
                           f"the run: {why}; every record is in samples/, and --resume rebuilds its output "
                           f"(--drop-writer {writer.name} resumes without it)")

    def start(self, run: RunStart) -> None:
        self.started = True
        self._each("start", run)

    def task_start(self, task: str) -> None:
        self._each("task_start", task)

    def write(self, task: str, record: Mapping[str, Any]) -> None:
        self._each("write", task, record)

    def replay(self, task: str, record: Mapping[str, Any]) -> None:
        """A record kept from before a resume: to every writer but the samples file, which holds it."""
        self._each("write", task, record, skip=1)

    def task_end(self, event: TaskDone) -> None:
        self._each("task_end", event)

    def end(self, summary: dict) -> None:
        """Every writer that started gets the end, even when one before it failed; the first core
        failure is raised. The plugin writers left out are in the summary (``run.writers_failed``),
        written again when one fails in its end, or an interrupt comes while the writers end."""
        first: OutputError | None = None
        run = summary.get("run") if isinstance(summary.get("run"), dict) else {}
        run.update({"writers_failed": dict(self.failed)} if self.failed else {})
        core, self.core, before = self.core, [], dict(self.failed)
        try:
            for writer in core:
                try:
                    writer.end(summary)
                except OutputError as exc:
                    first = first or exc
            if self.started:
                self._each("end", summary)
        except KeyboardInterrupt as stop:  # (summary.json, if written, says the run finished: it says what stopped it)
            run["interrupted"], run["exit_status"] = interrupt_reason(stop)
            before = None
            raise
        finally:
            self.core = core
            if self.failed != before:
                run.update({"writers_failed": dict(self.failed)} if self.failed else {})
                for writer in core:
                    if isinstance(writer, SummaryWriter):
                        writer.end(summary)
        if first is not None:
            raise first
