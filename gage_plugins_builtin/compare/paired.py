"""The paired comparison of two run folders: the statistics (McNemar's exact test, the seeded paired
bootstrap), the stored runs read back, samples aligned by id, and the settings diff. The method is
described in :mod:`gage_plugins_builtin.compare` and docs/compare.md."""
from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from gage_eval.api import GageError, RunFolder, metric_value, stats

from gage_plugins_builtin.compare import CONFIDENCE, DEFAULT_SAMPLES, DEFAULT_SEED, DOWN, UP, mcnemar_exact_p
from gage_plugins_builtin.compare.groups import compare_groups
from gage_plugins_builtin.report.runsettings import ABSENT, check_groups, settings_of, unlisted_tasks

_DIGITS = re.compile(r"(\d+)")

# ---------------------------------------------------------------- statistics


def bootstrap_intervals(diffs: Mapping[str, list[float]], n: int, resamples: int, seed: int,
                        confidence: float = CONFIDENCE) -> dict[str, list[float]]:
    """The percentile bootstrap interval of the mean of each metric's per-sample differences.

    ``diffs[name]`` holds the difference B - A of each of the n paired samples (in one order,
    the same for every metric). Each resample draws n indices ``int(rng.random() * n)`` from
    ``random.Random(seed)``; the same indices serve every metric, so the intervals do not depend
    on which metrics are compared."""
    if n == 0 or resamples <= 0 or not diffs:
        return {}
    rng = random.Random(seed)
    rand = rng.random
    means: dict[str, list[float]] = {name: [] for name in diffs}
    getters = {name: d.__getitem__ for name, d in diffs.items()}
    for _ in range(resamples):
        idx = [int(rand() * n) for _ in range(n)]
        for name, get in getters.items():
            means[name].append(sum(map(get, idx)) / n)
    alpha = (1.0 - confidence) / 2
    out = {}
    for name, values in means.items():
        values.sort()
        out[name] = [stats.quantile(values, alpha), stats.quantile(values, 1.0 - alpha)]  # numpy's default
    return out


# ---------------------------------------------------------------- reading run folders

class StoredRun:
    """A run folder's summary.json, config.json and inputs.json."""

    def __init__(self, path: Path):
        self.path = path
        self.folder = folder = RunFolder(path)
        summary_path = folder.summary_file
        if not path.is_dir():
            raise GageError(f"{path}: not a folder; compare takes two run folders (each with a summary.json)")
        if not summary_path.exists() and not summary_path.is_symlink():
            raise GageError(f"{path}: not a run folder (no summary.json); compare takes two run folders "
                            f"written by gage-eval")
        folder.check_idle("compare")
        self.summary = folder.summary()
        check_groups(folder.summary_file, self.summary)
        self.config = folder.config(missing_ok=True) or {}
        self.inputs = folder.inputs(missing_ok=True)

    @property
    def run(self) -> dict:
        return self.summary["run"]

    @property
    def tasks(self) -> dict:
        return self.summary["tasks"]

    def samples(self, task: str, warn: Callable[[str], None]) -> dict[str, dict]:
        """The task's records by sample id (a repeated id: the last record, with a warning)."""
        path = self.folder.samples_file(task)
        if not path.exists():
            raise GageError(f"{path}: missing; compare aligns the samples of task {task!r} from it")
        records: dict[str, dict] = {}
        repeated = 0
        for _, record in self.folder.records(task):
            sid = record.get("id")
            if sid is None:
                raise GageError(f"{path}: a record without 'id'; compare aligns samples by id")
            sid = str(sid)
            if sid in records:
                repeated += 1
            records[sid] = record
        if repeated:
            warn(f"{path}: {repeated} sample id(s) appear more than once; the last record of each is used")
        return records


def _errored(record: Mapping[str, Any]) -> bool:
    """A row that errored or was not scored: left out of the paired statistics."""
    result = record.get("eval_result") or {}
    return result.get("error") is not None or not isinstance(result.get("metrics"), dict)


def _row_values(record: Mapping[str, Any], names: Iterable[str]) -> tuple[bool, dict[str, float | None], Any]:
    """(errored, metric values, overall.passed) of one sample record."""
    if _errored(record):
        return True, {}, None
    result = record["eval_result"]
    metrics = result["metrics"]
    values: dict[str, float | None] = {}
    for name in names:
        try:
            values[name] = metric_value(metrics.get(name))
        except GageError:
            values[name] = None
    passed = (result.get("overall") or {}).get("passed")
    return False, values, passed


# ---------------------------------------------------------------- comparing

def _is_binary(values: Iterable[float]) -> bool:
    return all(v == 0.0 or v == 1.0 for v in values)


def _paired_metric(ids: list[str], a: list[float], b: list[float]) -> dict[str, Any]:
    n = len(ids)
    mean_a = sum(a) / n if n else None
    mean_b = sum(b) / n if n else None
    out: dict[str, Any] = {
        "n": n, "mean_a": mean_a, "mean_b": mean_b,
        "diff": (mean_b - mean_a) if n else None, "ci": None,
        "binary": bool(n) and _is_binary(a) and _is_binary(b), "mcnemar": None, "flips": None,
    }
    if out["binary"]:
        up = [i for i, x, y in zip(ids, a, b) if x == 0.0 and y == 1.0]
        down = [i for i, x, y in zip(ids, a, b) if x == 1.0 and y == 0.0]
        # b: A right, B wrong (1->0); c: A wrong, B right (0->1)
        out["mcnemar"] = {"b": len(down), "c": len(up), "p": mcnemar_exact_p(len(down), len(up))}
        out["flips"] = {UP: up, DOWN: down}
    return out


def _add_intervals(compared: dict[str, dict[str, Any]], diffs: Mapping[str, list[float]], missing: Mapping[str, int],
                   per_metric_ids: Mapping[str, list[str]], resamples: int, seed: int) -> None:
    """Each compared metric's paired bootstrap interval; one bootstrap per set of ids (usually
    one: every metric has a value on every paired row)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, ids in per_metric_ids.items():
        groups.setdefault(tuple(ids), []).append(name)
    for ids, group in groups.items():
        cis = bootstrap_intervals({name: diffs[name] for name in group}, len(ids), resamples, seed)
        for name in group:
            compared[name]["ci"] = cis.get(name)
            compared[name]["missing"] = missing[name]


def compare_task(run_a: StoredRun, run_b: StoredRun, task: str, *, resamples: int, seed: int,
                 warn: Callable[[str], None], pairs: dict | None = None) -> dict[str, Any]:
    """One task compared; ``pairs`` (when given) gets each compared metric's paired values,
    ``{metric: (ids, A's values, B's values)}``, which the groups' comparison pools."""
    sum_a, sum_b = run_a.tasks[task], run_b.tasks[task]
    metrics_a = list((sum_a.get("metrics") or {}).keys())
    metrics_b = set((sum_b.get("metrics") or {}).keys())
    names = [m for m in metrics_a if m in metrics_b]
    rec_a, rec_b = run_a.samples(task, warn), run_b.samples(task, warn)
    common = sorted(set(rec_a) & set(rec_b), key=_natural_key)
    if not common:
        raise GageError(f"{run_a.path} and {run_b.path}: task {task!r} has no sample id in common "
                        f"({len(rec_a)} and {len(rec_b)} samples); the runs cannot be compared")
    if len(common) < len(rec_a) or len(common) < len(rec_b):
        warn(f"task {task!r}: the sample ids overlap only partly: {len(rec_a)} in {run_a.path}, "
             f"{len(rec_b)} in {run_b.path}, {len(common)} in both; comparing those {len(common)}")
    row_a = {sid: _row_values(rec_a[sid], names) for sid in common}
    row_b = {sid: _row_values(rec_b[sid], names) for sid in common}
    errored_a = sum(map(_errored, rec_a.values()))
    errored_b = sum(map(_errored, rec_b.values()))
    paired = [sid for sid in common if not row_a[sid][0] and not row_b[sid][0]]
    primary = sum_a.get("primary_metric")

    compared: dict[str, dict[str, Any]] = {}
    diffs: dict[str, list[float]] = {}
    missing: dict[str, int] = {}
    per_metric_ids: dict[str, list[str]] = {}

    def pair(name: str, ids: list[str], a: list[float], b: list[float]) -> None:
        per_metric_ids[name] = ids
        missing[name] = len(paired) - len(ids)
        compared[name] = _paired_metric(ids, a, b)
        diffs[name] = [y - x for x, y in zip(a, b)]
        if pairs is not None:
            pairs[name] = (ids, a, b)

    for name in names:
        ids = [sid for sid in paired if row_a[sid][1].get(name) is not None and row_b[sid][1].get(name) is not None]
        pair(name, ids, [row_a[sid][1][name] for sid in ids], [row_b[sid][1][name] for sid in ids])
    if not (primary in compared and compared[primary]["binary"]):
        ids = [sid for sid in paired if isinstance(row_a[sid][2], bool) and isinstance(row_b[sid][2], bool)]
        if ids:
            pair("overall.passed", ids, [float(row_a[sid][2]) for sid in ids], [float(row_b[sid][2]) for sid in ids])
    _add_intervals(compared, diffs, missing, per_metric_ids, resamples, seed)
    return {
        "primary_metric": primary,
        "ids": {"a": len(rec_a), "b": len(rec_b), "common": len(common),
                "only_in_a": len(rec_a) - len(common), "only_in_b": len(rec_b) - len(common)},
        "errored": {"a": errored_a, "b": errored_b, "left_out": len(common) - len(paired)},
        "paired": len(paired),
        "metrics_only_in_a": [m for m in metrics_a if m not in metrics_b],
        "metrics_only_in_b": sorted(metrics_b - set(metrics_a)),
        "metrics": compared,
    }


def _natural_key(sid: str) -> tuple:
    """piqa-2 before piqa-10: digit runs compare as numbers (text and digits alternate in step)."""
    return tuple(int(part) if i % 2 else part for i, part in enumerate(_DIGITS.split(sid))), sid


def settings_diff(run_a: StoredRun, run_b: StoredRun, tasks: list[str]) -> list[dict[str, Any]]:
    """One row per setting of either run: key, a, b (None when absent), in_a, in_b, same."""
    a, b = settings_of(run_a, tasks), settings_of(run_b, tasks)
    # a run from before run.reproducibility existed: one row says so, not one per missing leaf
    for mine, other, run in ((a, b, run_a), (b, a, run_b)):
        if not isinstance(run.run.get("reproducibility"), dict):
            for key in [k for k in other if k.startswith("reproducibility.")]:
                del other[key]
            mine["reproducibility"] = ABSENT
            other.setdefault("reproducibility", "(recorded)")
    keys = list(a) + [k for k in b if k not in a]
    rows = []
    for key in keys:
        va, vb = a.get(key, ABSENT), b.get(key, ABSENT)
        in_a, in_b = va is not ABSENT, vb is not ABSENT
        rows.append({"key": key, "a": va if in_a else None, "b": vb if in_b else None,
                     "in_a": in_a, "in_b": in_b, "same": in_a == in_b and va == vb})
    return rows


def compare_runs(path_a: Path, path_b: Path, *, tasks: Iterable[str] = (), resamples: int = DEFAULT_SAMPLES,
                 seed: int = DEFAULT_SEED, warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The whole comparison as a JSON-ready dict (what ``--json`` prints)."""
    warn = warn or (lambda msg: None)
    if resamples < 0:
        raise GageError(f"--samples {resamples}: the number of bootstrap resamples must be 0 or more")
    run_a, run_b = StoredRun(Path(path_a)), StoredRun(Path(path_b))
    for run in (run_a, run_b):
        if run.run.get("interrupted"):  # (its rows are a part of the run's)
            warn(f"{run.path} did not finish ({run.run['interrupted']}); the rows it stored are compared")
        unlisted = unlisted_tasks(run.path, run.tasks)
        if unlisted:
            warn(f"{run.folder.summary_file} does not list task(s) {', '.join(unlisted)}, whose records "
                 f"{run.folder.samples_dir} holds; compare takes a task's metrics from summary.json, so they "
                 f"are left out")
    in_a, in_b = list(run_a.tasks), set(run_b.tasks)
    both = [t for t in in_a if t in in_b]
    wanted = list(dict.fromkeys(tasks))
    if wanted:
        for t in wanted:
            if t not in both:
                where = " and ".join(str(r.path) for r, s in ((run_a, set(in_a)), (run_b, in_b)) if t not in s)
                raise GageError(f"--task {t}: not in {where}; the tasks in both runs: {', '.join(both) or 'none'}")
        selected = wanted
    else:
        selected = both
    if not selected:
        raise GageError(f"{run_a.path} and {run_b.path}: no task in common (A: {', '.join(in_a) or 'none'}; "
                        f"B: {', '.join(sorted(in_b)) or 'none'})")
    result: dict[str, Any] = {
        "run_a": {"path": str(run_a.path), "id": run_a.run.get("id")},
        "run_b": {"path": str(run_b.path), "id": run_b.run.get("id")},
        "seed": seed, "bootstrap_samples": resamples, "confidence": CONFIDENCE,
        "tasks_only_in_a": [t for t in in_a if t not in in_b],
        "tasks_only_in_b": sorted(in_b - set(in_a)),
        "tasks": {},
    }
    pairs: dict[str, dict] = {}
    for task in selected:
        result["tasks"][task] = compare_task(run_a, run_b, task, resamples=resamples, seed=seed, warn=warn,
                                             pairs=pairs.setdefault(task, {}))
    groups_a, groups_b = run_a.summary.get("groups") or {}, run_b.summary.get("groups") or {}
    result["groups"] = compare_groups(groups_a, groups_b, pairs, resamples=resamples, seed=seed)
    result["groups_only_in_a"] = [g for g in groups_a if g not in groups_b]
    result["groups_only_in_b"] = [g for g in groups_b if g not in groups_a]
    result["settings"] = settings_diff(run_a, run_b, selected)
    return result
