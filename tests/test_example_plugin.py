"""The example plugin package, installed for real: a fresh venv, a non-editable install of
gage-eval and of examples/gage-eval-plugin-example, and the venv's own ``gage-eval`` binary.

This also checks that a wheel install of gage-eval carries tasks/ and schemas/.
Needs PyPI (or a pip cache) for pluggy, click, jsonschema, jinja2, pyyaml and hatchling.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "gage-eval-plugin-example"
TASK = "example_trivia"
BACKEND = "example/lookup"

# word_f1 of the first ten rows with the bundled facts, worked by hand: the answers are
# right except q07 ("carbon dioxide and water" vs "carbon dioxide": P 1/2, R 1, F1 2/3)
# and q08 (no fact about spiders: "I don't know." shares no word with "eight").
EXPECTED_F1 = {"trivia-q01": 1.0, "trivia-q04": 1.0, "trivia-q05": 1.0, "trivia-q07": 2 / 3,
               "trivia-q08": 0.0, "trivia-q10": 1.0}


class Venv:
    def __init__(self, path: Path):
        self.path = path
        self.bin = path / ("Scripts" if os.name == "nt" else "bin")

    def env(self, **extra: str) -> dict:
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "GAGE_EVAL_DISABLE_PLUGINS", "VIRTUAL_ENV")}
        env.update(HF_HUB_OFFLINE="1", PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
        return env

    def run(self, *args: str, cwd: Path, check: bool = True, env: dict | None = None,
            exe: str = "gage-eval") -> subprocess.CompletedProcess:
        proc = subprocess.run([str(self.bin / exe), *map(str, args)], cwd=cwd, env=env or self.env(),
                              capture_output=True, text=True, timeout=300)
        if check and proc.returncode != 0:
            pytest.fail(f"{exe} {' '.join(map(str, args))} exited {proc.returncode}:\n"
                        f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return proc


# -- the plugin's logic, imported from the source folder (fast) ----------------


@pytest.fixture
def example(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    import gage_eval_plugin_example.backend as backend
    import gage_eval_plugin_example.metric as metric

    return backend, metric


def test_word_f1(example):
    _, metric = example
    from gage_eval.api.metric import MetricContext

    assert metric.f1("The Pacific Ocean", "pacific ocean") == 1.0
    assert metric.f1("Leonardo", "Leonardo da Vinci") == pytest.approx(0.5)
    assert metric.f1("", "") == 1.0 and metric.f1("x", "") == 0.0
    m = metric.WordF1()
    sample = {"references": [{"answer": [{"type": "text", "text": "carbon dioxide"}]}, "CO2"]}
    got = m.compute(MetricContext(sample=sample, model_output={"text": "carbon dioxide and water"}))
    assert got["value"] == pytest.approx(2 / 3) and got["reference"] == "carbon dioxide"
    with pytest.raises(ValueError, match="field path"):
        metric.WordF1(prediction="text")


def test_lookup_backend(example, tmp_path):
    backend, _ = example
    from gage_eval.api.backend import Request
    from gage_eval.api.errors import GageError

    b = backend.LookupBackend()
    b.open()
    assert b.answer("What is the highest mountain in Africa?") == "Mount Kilimanjaro"  # 2 keywords beat 1
    assert b.answer("What is the capital of New Zealand?") == "Wellington"
    assert b.answer("How many legs does a spider have?") == backend.UNKNOWN
    req = Request(kind="generate", sample_id="s", prompt="Answer briefly.\nQuestion: Who painted the Mona Lisa?\nAnswer:")
    (out,) = b.run([req])
    assert out.text == "Leonardo" and out.error is None
    bad = tmp_path / "facts.json"
    bad.write_text('[{"keywords": [], "answer": "x"}]')
    with pytest.raises(GageError, match="fact 0"):
        backend.LookupBackend(facts=str(bad)).open()
    with pytest.raises(GageError, match="unknown argument"):
        backend.LookupBackend(temperature=0)


# -- the installed package, driven through a venv's gage-eval (slow) -----------


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Venv:
    path = tmp_path_factory.mktemp("plugin-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, capture_output=True, timeout=120)
    v = Venv(path)
    # non-editable, both at once; the example's dependency on gage-eval is met by ROOT
    v.run("install", "-q", str(ROOT), str(EXAMPLE), cwd=path.parent, exe="pip")
    return v


@pytest.fixture
def work(tmp_path) -> Path:
    return tmp_path


@pytest.mark.slow
def test_installed_copy_is_not_the_checkout(venv, work):
    out = venv.run("-c", "import gage_eval, gage_plugins_builtin, gage_eval_plugin_example as e;"
                   "print(gage_eval.__file__); print(gage_plugins_builtin.tasks_dir()); print(e.__file__)",
                   cwd=work, exe="python").stdout.split()
    for line in out:
        assert Path(line).resolve().is_relative_to(venv.path.resolve()), line
    # the wheel carries tasks/ and schemas/
    site_builtin = Path(out[1])
    assert (site_builtin / "piqa" / "task.yaml").is_file()
    assert (Path(out[0]).parent / "schemas" / "instance_level_eval_0.2.0.schema.json").is_file()


@pytest.mark.slow
def test_plugins_lists_the_example_with_version_and_registrations(venv, work):
    rows = json.loads(venv.run("plugins", "--json", cwd=work).stdout)
    by_name = {r["name"]: r for r in rows}
    assert "builtin" in by_name
    ex = by_name["example"]
    assert ex["version"] == "0.1.0"
    assert ex["registers"]["backends"] == [BACKEND]
    assert ex["registers"]["metrics"] == ["example/word_f1"]
    (task_path,) = ex["registers"]["task_paths"]
    assert Path(task_path).resolve().is_relative_to(venv.path.resolve())
    text = venv.run("plugins", cwd=work).stdout
    assert "example 0.1.0" in text and f"backends: {BACKEND}" in text


@pytest.mark.slow
def test_tasks_lists_the_example_task_and_the_builtin_piqa(venv, work):
    rows = {r["name"]: r for r in json.loads(venv.run("tasks", "--json", cwd=work).stdout)}
    assert rows[TASK]["origin"] == "example"
    assert rows[TASK]["kind"] == "generate"
    assert rows["piqa"]["origin"] == "builtin"
    assert Path(rows["piqa"]["folder"]).resolve().is_relative_to(venv.path.resolve())


@pytest.mark.slow
def test_run_example_task_with_example_backend(venv, work):
    venv.run("--tasks", TASK, "--model", BACKEND, "--limit", 10, "-q", "-o", work, "--run-id", "r1", cwd=work)
    run = work / "r1"
    summary = json.loads((run / "summary.json").read_text())
    task = summary["tasks"][TASK]
    assert task["counts"]["total"] == 10 and task["counts"]["errored"] == 0
    assert task["primary_metric"] == "word_f1"
    assert summary["run"]["model"]["model_id"] == "gage-eval-plugin-example/lookup"
    assert summary["run"]["model"]["settings"]["n_facts"] == 12
    assert summary["run"]["versions"]["plugins"].get("example") == "0.1.0"
    samples = [json.loads(line) for line in (run / "samples" / f"{TASK}.jsonl").read_text().splitlines()]
    f1 = {s["id"]: s["eval_result"]["metrics"]["word_f1"]["value"] for s in samples}
    for sid, want in EXPECTED_F1.items():
        assert f1[sid] == pytest.approx(want), sid
    assert task["metrics"]["word_f1"]["value"] == pytest.approx(sum(f1.values()) / 10)
    # exact_match (builtin) does not drop articles: "The Pacific Ocean" is not "Pacific Ocean"
    q04 = next(s for s in samples if s["id"] == "trivia-q04")
    assert q04["eval_result"]["metrics"]["exact_match"]["value"] == 0.0
    assert set(task["slices"]["topic"]) == {"arts", "geography", "science"}
    for schema, folder in (("instance", "instances"), ("sample", "samples")):
        out = venv.run("validate", run / folder / f"{TASK}.jsonl", "--schema", schema, cwd=work).stdout
        assert "10 rows, 10 valid, 0 invalid" in out


@pytest.mark.slow
def test_piqa_runs_from_the_wheel(venv, work):
    venv.run("--tasks", "piqa", "--model", "dummy", "--limit", 5, "-q", "-o", work, "--run-id", "p", cwd=work)
    out = venv.run("validate", work / "p" / "instances" / "piqa.jsonl", "--schema", "instance", cwd=work).stdout
    assert "5 rows, 5 valid, 0 invalid" in out


@pytest.mark.slow
def test_backend_capabilities_are_checked(venv, work):
    proc = venv.run("--tasks", "piqa", "--model", BACKEND, "-q", "-o", work, cwd=work, check=False)
    assert proc.returncode == 2
    assert "loglikelihood" in proc.stderr and BACKEND in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_bad_backend_argument_is_a_clear_error(venv, work):
    proc = venv.run("--tasks", TASK, "--model", BACKEND, "--model-args", "facts=/nonexistent.json",
                    "-q", "-o", work, cwd=work, check=False)
    assert proc.returncode == 2
    assert "facts=/nonexistent.json: cannot read" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_disable_plugins_hides_the_example(venv, work):
    env = venv.env(GAGE_EVAL_DISABLE_PLUGINS="example")
    names = [r["name"] for r in json.loads(venv.run("plugins", "--json", cwd=work, env=env).stdout)]
    assert "example" not in names and "builtin" in names
    tasks = [r["name"] for r in json.loads(venv.run("tasks", "--json", cwd=work, env=env).stdout)]
    assert TASK not in tasks and "piqa" in tasks
    proc = venv.run("--tasks", "piqa", "--model", BACKEND, "-q", "-o", work, cwd=work, env=env, check=False)
    assert proc.returncode == 2 and f"unknown backend {BACKEND!r}" in proc.stderr


# -- the example's writer and schema ------------------------------------------------

ROWS = EXAMPLE / "gage_eval_plugin_example" / "tasks" / TASK / "rows.jsonl"
BAD_ROWS = (
    '{"schema_version": "v1", "id": "trivia-q01", "task_type": "open-qa", "messages": [{"role": "user", '
    '"content": [{"type": "text", "text": "Capital of Peru"}]}], "references": ["Lima", " lima"], '
    '"data_tag": {"topic": "geography"}}\n'
    '{"schema_version": "v1", "id": "q2", "task_type": "open-qa", "messages": [{"role": "user", '
    '"content": [{"type": "text", "text": "Which?"}]}], "references": ["x"], "data_tag": {"topic": "sport"}}\n'
    '{"schema_version": "v1", "id": "trivia-q03", "task_type": "open-qa", "messages": [{"role": "user", '
    '"content": [{"type": "text", "text": "Once?"}]}], "references": ["y"], "data_tag": {"topic": "arts"}}\n'
    '{"schema_version": "v1", "id": "trivia-q03", "task_type": "open-qa", "messages": [{"role": "user", '
    '"content": [{"type": "text", "text": "Again?"}]}], "references": ["y"], "data_tag": {"topic": "arts"}}\n'
)


def test_schema_rules(example, monkeypatch):
    from gage_eval_plugin_example import schema

    assert schema.errors({"references": ["Lima", " LIMA ", "Cusco"]}) == [
        ("$.references[1]", "repeats references[0] (' LIMA ')")]
    assert schema.errors({"references": "Lima"}) == [] and schema.errors([1]) == []
    row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Capital of Peru"}]}]}
    assert schema.warnings(row) == [("$.messages", "the question does not end with '?'")]
    assert json.loads(schema.SCHEMA_PATH.read_text())["properties"]["task_type"] == {"const": "open-qa"}


def test_scores_csv_writer_holds_errored_rows_until_the_columns_are_known(example, tmp_path):
    import csv

    from gage_eval.api.events import RunStart, TaskDone
    from gage_eval_plugin_example.writer import ScoresCsv

    w = ScoresCsv()
    w.start(RunStart("r", tmp_path, ("t",), "m"))
    w.task_start("t")
    w.write("t", {"id": "a", "eval_result": {"error": {"stage": "inference", "message": "boom"}}})
    w.write("t", {"id": "b", "eval_result": {"metrics": {"f1": {"value": 0.5}, "em": 0.0}}})
    w.task_end(TaskDone("r", "t", {}, {}))
    rows = list(csv.reader((tmp_path / "scores" / "t.csv").open()))
    assert rows == [["id", "error", "em", "f1"], ["a", "boom", "", ""], ["b", "", "0.0", "0.5"]]


@pytest.mark.slow
def test_installed_schema_validates_the_shipped_rows_and_refuses_bad_ones(venv, work):
    out = venv.run("validate", ROWS, "--schema", "example/trivia", cwd=work).stdout
    assert "12 rows, 12 valid, 0 invalid, 0 warnings (schema example/trivia)" in out
    bad = work / "bad.jsonl"
    bad.write_text(BAD_ROWS)
    proc = venv.run("validate", bad, "--schema", "example/trivia", cwd=work, check=False)
    assert proc.returncode == 1, proc.stderr
    assert f"{bad}:1: warning: $.messages: the question does not end with '?'" in proc.stdout
    assert f"{bad}:1: $.references[1]: repeats references[0] (' lima')" in proc.stdout
    assert f"{bad}:2: $.data_tag.topic:" in proc.stdout and f"{bad}:2: $.id:" in proc.stdout
    assert f"{bad}:4: $.id: duplicate sample id 'trivia-q03'" in proc.stdout  # read as a run reads it
    assert "4 rows, 1 valid, 3 invalid, 1 warnings" in proc.stdout
    rows = json.loads(venv.run("plugins", "--json", cwd=work).stdout)
    registers = next(r for r in rows if r["name"] == "example")["registers"]
    assert registers["schemas"] == ["example/trivia"] and registers["writers"] == ["example/scores_csv"]


@pytest.mark.slow
def test_installed_writer_writes_every_sample_and_is_rebuilt_on_resume(venv, work):
    import csv

    venv.run("--tasks", TASK, "--model", BACKEND, "--limit", 10, "-q", "-o", work, "--run-id", "w",
             "--writer", "example/scores_csv", cwd=work)
    run = work / "w"
    samples = [json.loads(line) for line in (run / "samples" / f"{TASK}.jsonl").read_text().splitlines()]
    rows = list(csv.DictReader((run / "scores" / f"{TASK}.csv").open(encoding="utf-8")))
    assert [r["id"] for r in rows] == [s["id"] for s in samples]
    for row, sample in zip(rows, samples):
        metrics = sample["eval_result"]["metrics"]
        assert float(row["word_f1"]) == pytest.approx(metrics["word_f1"]["value"])
        assert float(row["exact_match"]) == metrics["exact_match"]["value"] and row["error"] == ""
    # a writer named only on resume, into another folder: rebuilt from every kept record
    elsewhere = work / "csv"
    venv.run("--resume", run, "-q", "--writer", f"example/scores_csv:folder={elsewhere}", cwd=work)
    again = list(csv.DictReader((elsewhere / f"{TASK}.csv").open(encoding="utf-8")))
    assert again == rows
    env = venv.env(GAGE_EVAL_DISABLE_PLUGINS="example")
    proc = venv.run("validate", ROWS, "--schema", "example/trivia", cwd=work, env=env, check=False)
    assert proc.returncode == 2 and "unknown schema 'example/trivia'" in proc.stderr
