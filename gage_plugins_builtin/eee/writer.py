"""The ``instances`` writer (on by default): ``instances/<task>.jsonl``, the Every Eval Ever
record(s) of each sample in the version the run names (``--eee-version``, run option
``eee_version``): 0.2.0 (spec 002, the default), one instance_level_eval record a sample; or
0.3.0, one record per metric value a sample contributed, and at the end the aggregate record
``eee_aggregate.json`` in the run folder. It also writes a merged run's (``merged = True`` on
its factory).

A run in 0.2.0 removes an ``eee_aggregate.json`` an earlier 0.3.0 run of the folder left (a
resume rebuilds instances/ in the version it names)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from gage_eval.api import GageError, RunFolder, Writer, events
from gage_plugins_builtin.eee import aggregate, v030
from gage_plugins_builtin.eee.v020 import build_instance


def self_deployed_backends() -> frozenset[str]:
    """The builtin backends whose factories declare ``self_deployed`` (they run the model themselves)."""
    from gage_plugins_builtin import BACKEND_TRAITS

    return frozenset(name for name, traits in BACKEND_TRAITS.items() if traits.get("self_deployed"))


class InstancesWriter(Writer):
    name = "instances"
    read_only = True  # it builds new instances from each record and changes none (uncopied: tests/core/test_writers.py)

    def __init__(self) -> None:
        self.folder: RunFolder | None = None
        self.model_id = self.run_id = ""
        self.eee_version = "0.2.0"
        self._notes = v030.MetricNotes()  # what the 0.3.0 aggregate needs from the records
        self._files: Any = None  # the open instances files, by task (RunFolder.task_files)
        self._left: set[str] = set()  # the tasks whose instances file an earlier run of the folder left

    def path(self, task: str) -> Path:
        assert self.folder is not None
        return self.folder.instances_file(task)

    def start(self, run: events.RunStart) -> None:
        self.folder, self.model_id, self.run_id = RunFolder(run.run_dir), run.model_id, run.run_id
        self._files = self.folder.task_files(self.folder.instances_dir)
        found = self.folder.instances_dir
        self._left = {str(p.relative_to(found).with_suffix("")) for p in found.rglob("*.jsonl")} if found.is_dir() else set()
        version = run.options.get("eee_version")
        self.eee_version = version if version in v030.VERSIONS else "0.2.0"

    def task_start(self, task: str) -> None:
        if task in self._left:  # rebuilt whole from the kept records on resume (looked for once, at the start)
            self.path(task).unlink(missing_ok=True)

    def write(self, task: str, record: Mapping[str, Any]) -> None:
        # (each instance to the task's file, opened at its first record: a task that never wrote one leaves no file)
        if self.eee_version != v030.EEE_VERSION:
            self._files.write(task, build_instance(record, task=task, model_id=self.model_id, evaluation_id=self.run_id))
            return
        self._notes.add(task, record)
        for instance in v030.build_instances(record, task=task, model_id=self.model_id, evaluation_id=self.run_id):
            self._files.write(task, instance)

    def task_end(self, event: events.TaskDone) -> None:
        if self._files is not None:
            self._files.close(event.task)

    def end(self, summary: Mapping[str, Any]) -> None:
        if self.folder is None:
            return
        self._files.close()
        if self.eee_version == v030.EEE_VERSION:
            self.folder.write_json(v030.AGGREGATE_FILE, aggregate.build_aggregate(
                summary, notes=self._notes, inputs=self._inputs(), self_deployed=self_deployed_backends()))
        else:
            (self.folder.path / v030.AGGREGATE_FILE).unlink(missing_ok=True)

    def _inputs(self) -> Mapping[str, Any]:
        """inputs.json ({} when missing or unreadable: the aggregate then names no source files)."""
        assert self.folder is not None
        try:
            return self.folder.inputs(missing_ok=True)
        except GageError:
            return {}
