"""The settings of a stored run that may change its numbers, as leaf values under dotted keys:
the model and judge (name, model_id, args, settings), the run settings (less where the run was
written and how it was shown), each task's version, folder hash and data hashes (inputs.json),
gage-eval and plugin versions and, when recorded, ``run.reproducibility``. ``compare`` diffs two
runs' with it; the report names what differs between several."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping, Protocol

from gage_eval.api import GageError, RunFolder, jsonio, read_yaml

__all__ = ["ABSENT", "StoredSettings", "check_groups", "settings_of", "task_version", "unlisted_tasks"]


# run.settings keys left out of the settings diff: where the run was written and how it was
# shown (they never change a number), and the model keys shown under model.* already.
SETTINGS_NOISE = frozenset({"output_dir", "run_id", "command", "quiet", "report", "config_file", "writers",
                             "cache", "eee_version", "model", "model_args", "judge_model", "judge_args"})


def unlisted_tasks(run_dir: Path, listed: Mapping[str, Any]) -> list[str]:
    """The tasks whose samples file ``run_dir`` holds that its summary.json does not list (``listed``:
    its tasks), e.g. a summary edited by hand or written before the run ended; the report shows
    them and compare names them, where leaving them out would lose their rows without a word."""
    samples = RunFolder(run_dir).samples_dir
    try:
        names = sorted(p.relative_to(samples).as_posix()[:-6] for p in samples.rglob("*.jsonl") if p.is_file())
    except OSError:
        return []
    return [n for n in names if n not in listed and _TASK_NAME.fullmatch(n)]  # (no other file is a task's)


_TASK_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*")


def check_groups(path: Path, summary: Mapping[str, Any]) -> None:
    """summary.json's ``groups`` (``path``: the file) as the report and compare read them: a wrong
    type (a summary edited by hand) is one GageError naming the key, never a crash in a page."""
    groups = summary.get("groups") or {}
    checks = [("", groups, dict, "an object")]
    for name, g in groups.items() if isinstance(groups, dict) else ():
        checks.append((f".{name}", g, dict, "an object"))
        g = g if isinstance(g, dict) else {}
        checks += [(f".{name}.{k}", g.get(k), t, what) for k, t, what in _GROUP_KEYS if g.get(k) is not None]
        for metric, e in (g.get("metrics") if isinstance(g.get("metrics"), dict) else {}).items():
            checks.append((f".{name}.metrics.{metric}", e, dict, "an object"))
            e = e if isinstance(e, dict) else {}
            checks += [(f".{name}.metrics.{metric}.{k}", e.get(k), t, what) for k, t, what in _GROUP_METRIC_KEYS
                       if e.get(k) is not None]
    for key, value, types, what in checks:
        if not isinstance(value, types) or isinstance(value, bool) and types is not bool:  # (True is no number)
            raise GageError(f"{path}: key 'groups{key}': expected {what}, got {jsonio.json_type(value)}; "
                            f"not a summary gage-eval wrote")


_GROUP_KEYS = (("alias", str, "a string"), ("depth", int, "a whole number"), ("members", list, "a list"),
               ("tasks", list, "a list"), ("metrics", dict, "an object"))
_GROUP_METRIC_KEYS = (("value", (int, float), "a number"), ("stderr", (int, float), "a number"),
                      ("n", int, "a whole number"), ("tasks", int, "a whole number"), ("missing", list, "a list"),
                      ("weight_by_size", bool, "true or false"))  # (as schemas/summary.schema.json's group)


class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


ABSENT = _Absent()


class StoredSettings(Protocol):
    """What :func:`settings_of` reads of a stored run (compare's StoredRun is one)."""

    run: Mapping[str, Any]  # summary.json's run section
    tasks: Mapping[str, Any]  # summary.json's tasks
    config: Mapping[str, Any]  # config.json ({} when missing)
    inputs: Mapping[str, Any]  # inputs.json ({} when missing)


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    """Leaf values under dotted keys; an empty object has no leaf (``{}`` and absent read the same)."""
    if isinstance(value, dict):
        for key in sorted(value):
            _flatten(f"{prefix}.{key}", value[key], out)
    else:
        out[prefix] = value


def task_version(run: StoredSettings, task: str) -> Any:
    """The task's version as recorded (summary task entry or reproducibility); runs that did not
    record it: the ``version`` of the task.yaml in the run's task folder as it is now (its
    folder hash, beside it in the diff, says whether the folder changed since), else ABSENT."""
    entry = run.tasks.get(task) or {}
    if "version" in entry:
        return entry["version"]
    repro = run.run.get("reproducibility")
    if isinstance(repro, dict):
        tasks = repro.get("tasks")
        if isinstance(tasks, dict) and isinstance(tasks.get(task), dict) and "version" in tasks[task]:
            return tasks[task]["version"]
    folder = (entry.get("source") or {}).get("folder")
    if isinstance(folder, str) and (Path(folder) / "task.yaml").is_file():
        try:
            spec = read_yaml(Path(folder) / "task.yaml")
        except GageError:
            return ABSENT
        if isinstance(spec, dict) and "version" in spec:
            return spec["version"]
    return ABSENT


def settings_of(run: StoredSettings, tasks: list[str]) -> dict[str, Any]:
    """The run's settings that may change results, as leaf values under dotted keys (ABSENT: not recorded)."""
    flat: dict[str, Any] = {}
    model = run.run.get("model") or {}
    if not model and run.config:
        model = {"name": run.config.get("model"), "args": run.config.get("model_args")}
    judge = run.run.get("judge")
    for role, entry in (("model", model), ("judge", judge or {})):
        for key in ("name", "model_id", "args", "settings"):
            if key in entry:
                _flatten(f"{role}.{key}", entry[key], flat)
    if not judge:
        flat["judge"] = None
    settings = run.run.get("settings") or run.config
    for key in sorted(settings):
        if key not in SETTINGS_NOISE:
            _flatten(f"settings.{key}", settings[key], flat)
    for task in tasks:
        flat[f"task.{task}.version"] = task_version(run, task)
        inputs = run.inputs.get(task) or {}
        folder = inputs.get("task_folder") or {}
        flat[f"task.{task}.folder_sha256"] = folder.get("sha256", ABSENT)
        data = inputs.get("data")
        flat[f"task.{task}.data_sha256"] = sorted(data.values()) if isinstance(data, dict) else ABSENT
        flat[f"task.{task}.data_files"] = sorted(data) if isinstance(data, dict) else ABSENT
    _flatten("versions", run.run.get("versions") or {}, flat)
    repro = run.run.get("reproducibility")
    if isinstance(repro, dict):
        repro = dict(repro)
        if isinstance(repro.get("tasks"), dict):  # only the compared tasks
            repro["tasks"] = {t: v for t, v in repro["tasks"].items() if t in tasks}
        _flatten("reproducibility", repro, flat)
    return flat
