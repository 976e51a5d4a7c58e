"""The golden-output run shared by make_golden.py (writes tests/golden/expected/) and
test_golden.py (compares against it): one dummy-backend run of piqa, mmmu, docvqa and
legal_eval_v1 on fixed slices of the real rows in ../shared/data, normalised so that only
deterministic content is kept."""
from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# GAGE_GOLDEN_SHARED: the shared data elsewhere (regenerating from a clean copy of an older commit).
SHARED_DATA = Path(os.environ.get("GAGE_GOLDEN_SHARED") or ROOT.parent / "shared" / "data")
EXPECTED = Path(__file__).resolve().parent / "expected"
TASKS = ("piqa", "mmmu", "docvqa", "legal_eval_v1")
FILES = ("samples", "instances")
ID_KEY = {"samples": "id", "instances": "sample_id"}
RUN_ID = "golden"

PIQA = "piqa/derived/validation.jsonl"
PIQA_ROWS = 20  # the first rows of the dev set (--limit)
DOCVQA = "docvqa/derived/DocVQA/validation-00000-of-00001.parquet"  # all 15 shipped rows
LEGAL = "legal_eval_v1/data/for_eval/merged_legal_eval_v1.jsonl"
# The smallest rows of each (task_type, dataset) in the shared file; apexv1:1382 (PDF text in
# the prompt, about 165 KB of output) is left to tests/legal/test_legal_run.py.
LEGAL_IDS = (
    "includebase:865121b48f7db568", "includebase:8bcf0f6f3145338f", "includebase:62079a32541ba727",
    "lexam:mcq:42495d69-85f1-431b-96aa-5a3a38d8497f:19", "lexam:mcq:495a7e85-e8de-4550-b33c-663ef03e92b0:15",
    "lexam:mcq:917c4406-9010-4f47-897f-f696d839ebca:9", "lexam:mcq:4a7d579a-350c-4d1a-885b-4989b81c6389:5",
    "lexam:open:db92e743-087f-4a2c-9544-2ef9c1385435:48", "lexam:open:1a30c80a-e971-4982-bb6b-8514cb2b0fc9:47",
    "lexam:open:c1e30f23-6789-4877-a69c-cbc517964724:50",
    "prbench:f7c2b6e164e103cc7206a98e", "prbench:2637ef1662c1c68be7c09a1e", "prbench:61cd386fe5e01d8bb98b0cc2",
)
# MMMU: a few rows of each subject's validation shard, with open questions and two-image rows.
MMMU_IDS = {
    "Accounting": (1, 2, 3, 4, 5, 6),
    "Economics": (1, 2, 3, 4, 14, 20, 25),
    "Finance": (1, 2, 3, 4, 8, 10),
}
JUDGE_ARGS = "response=fixed,text=Verdict: correct"

# Dropped wherever they occur: they change from run to run (or with the run id).
VOLATILE_KEYS = frozenset({"latency_ms", "timings", "evaluation_id"})


def write_slices(shared: Path, folder: Path) -> dict[str, Path]:
    """The --data files: legal and MMMU rows picked by id into FOLDER, piqa and DocVQA as shipped."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    lines = {json.loads(line)["id"]: line for line in (shared / LEGAL).read_text(encoding="utf-8").splitlines()}
    missing = [i for i in LEGAL_IDS if i not in lines]
    if missing:
        raise SystemExit(f"{shared / LEGAL}: golden legal ids not found: {', '.join(missing)}")
    legal = folder / "legal_eval_v1.jsonl"
    legal.write_text("".join(lines[i] + "\n" for i in LEGAL_IDS), encoding="utf-8")
    tables = []
    for subject, numbers in MMMU_IDS.items():
        table = pq.read_table(shared / "mmmu" / subject / "validation-00000-of-00001.parquet")
        wanted = {f"validation_{subject}_{n}" for n in numbers}
        keep = [i for i, v in enumerate(table.column("id").to_pylist()) if v in wanted]
        if len(keep) != len(wanted):
            raise SystemExit(f"{shared / 'mmmu' / subject}: golden MMMU ids not all found")
        tables.append(table.take(pa.array(keep)))
    mmmu = folder / "mmmu-validation.parquet"
    pq.write_table(pa.concat_tables(tables), mmmu)
    return {"piqa": shared / PIQA, "mmmu": mmmu, "docvqa": shared / DOCVQA, "legal_eval_v1": legal}


def run(shared: Path, work: Path) -> Path:
    """Run gage-eval in-process on the slices; returns the run folder."""
    from click.testing import CliRunner

    from gage_eval.cli import cli

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    data = write_slices(shared, work / "slices")
    args = ["--tasks", ",".join(TASKS), "--model", "dummy", "--judge-model", "dummy", "--judge-args", JUDGE_ARGS,
            "--limit", str(PIQA_ROWS), "-o", str(work / "runs"), "--run-id", RUN_ID, "-q"]
    for task, path in data.items():
        args += ["--data", f"{task}={path}"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    if result.exit_code != 0:
        raise RuntimeError(f"gage-eval {' '.join(args)} exited {result.exit_code}:\n{result.output}")
    return work / "runs" / RUN_ID


def normalise(value, replacements: list[tuple[str, str]]):
    """Drop VOLATILE_KEYS; absolute paths in strings become <shared>/..., <slices>/..., <repo>/..."""
    if isinstance(value, dict):
        return {k: normalise(v, replacements) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [normalise(v, replacements) for v in value]
    if isinstance(value, str):
        for old, new in replacements:
            if old in value:
                value = value.replace(old, new)
        return value
    return value


def _code_root() -> Path:
    """The checkout whose gage_eval is imported (the builtin task folders are under it)."""
    import gage_eval

    return Path(gage_eval.__file__).resolve().parents[1]


def collect(run_dir: Path, shared: Path, work: Path) -> dict[str, dict]:
    """{task: {"samples": [records by id], "instances": [...], "summary": task section}}, normalised."""
    # Longest first: the slices folder may lie under the repository (never under shared data).
    replacements = sorted([(str(shared.resolve()), "<shared>"), (str(shared), "<shared>"),
                           (str((work / "slices").resolve()), "<slices>"), (str(work / "slices"), "<slices>"),
                           (str(_code_root()), "<repo>"), (str(ROOT), "<repo>")], key=lambda p: -len(p[0]))
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    out: dict[str, dict] = {}
    for task in TASKS:
        entry: dict = {}
        for kind in FILES:
            path = run_dir / kind / f"{task}.jsonl"
            records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            records = [normalise(r, replacements) for r in records]
            entry[kind] = sorted(records, key=lambda r: str(r.get(ID_KEY[kind])))
        entry["summary"] = normalise(summary["tasks"][task], replacements)
        out[task] = entry
    return out


def dump_jsonl(records: list) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in records)


def load_expected(task: str) -> dict:
    folder = EXPECTED / task
    entry = {kind: [json.loads(line) for line in (folder / f"{kind}.jsonl").read_text(encoding="utf-8").splitlines()]
             for kind in FILES}
    entry["summary"] = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    return entry


def first_difference(expected, got, path: str = "") -> str | None:
    """The first place where two parsed JSON values differ, as 'path: expected X, got Y'; None if equal."""
    def show(v) -> str:
        text = json.dumps(v, ensure_ascii=False)
        return text if len(text) <= 300 else text[:300] + f"... ({len(text)} chars)"

    if type(expected) is not type(got):
        return f"{path or '<root>'}: expected {show(expected)}, got {show(got)}"
    if isinstance(expected, dict):
        for key in expected:
            if key not in got:
                return f"{path}.{key}: missing (expected {show(expected[key])})"
        for key in got:
            if key not in expected:
                return f"{path}.{key}: unexpected new field {show(got[key])}"
        for key in expected:
            found = first_difference(expected[key], got[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(expected, list):
        for i, (e, g) in enumerate(zip(expected, got)):
            found = first_difference(e, g, f"{path}[{i}]")
            if found:
                return found
        if len(expected) != len(got):
            return f"{path}: expected {len(expected)} items, got {len(got)}"
        return None
    if expected != got:
        return f"{path or '<root>'}: expected {show(expected)}, got {show(got)}"
    return None
