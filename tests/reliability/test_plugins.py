"""A broken or hostile plugin, installed beside gage-eval, through the real CLI: it cannot change
the record, the counts or the exit status; its sys.exit or exception is one line and the run goes
on without it; malformed backend outputs and NaN/inf metric values are row errors, never scored,
never dropped; a failing settings() still leaves a summary.

The plugin is tests/reliability/hostile/gage_hostile.py, installed for the subprocess by an
entry point in a dist-info folder on its PYTHONPATH (as pip would install it)."""
from __future__ import annotations

import json
import os

import pytest

from harness import GUARD, OK, ROOT, ROW_ERRORS, USAGE, check

HOSTILE = ROOT / "tests" / "reliability" / "hostile"
ROWS = 24  # the piqa rows shipped with the task
BAD_EVERY = 4  # the hostile backend's default: every 4th request is malformed


@pytest.fixture
def hostile(gage) -> dict:
    """The environment of a gage-eval process with the hostile plugin installed."""
    site = gage.tmp / "site"
    dist = site / "gage_hostile-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gage-hostile\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[gage_eval]\nhostile = gage_hostile\n")
    return {"PYTHONPATH": os.pathsep.join(map(str, (GUARD, ROOT, site, HOSTILE))), "HOSTILE_OBSERVER": ""}


def results(o) -> dict:
    """What a run concluded, without its timings: each record's id, error and metrics, each
    task's counts and metric values, the exit status."""
    records = [(r["id"], r.get("eval_result")) for r in o.records("piqa")]
    tasks = {name: (t["counts"], {m: e["value"] for m, e in t["metrics"].items()}, t["status"])
             for name, t in o.summary["tasks"].items()}
    return {"records": records, "tasks": tasks, "exit": o.summary["run"]["exit_status"]}


def baseline(gage, hostile) -> dict:
    o = gage("--tasks", "piqa", "--model", "dummy", run_id="plain", env=hostile)
    check(o, OK)
    assert len(o.records("piqa")) == ROWS
    return results(o)


# -- writers ----------------------------------------------------------------------------------


def test_a_writer_that_changes_the_record_and_summary_changes_nothing(gage, hostile):
    want = baseline(gage, hostile)
    o = gage("--tasks", "piqa", "--model", "dummy", "--writer", "hostile/mutate", env=hostile)
    check(o, OK)
    assert results(o) == want  # acc, counts, ids and status as without the writer
    assert "hijacked" not in (o.run_dir / "samples" / "piqa.jsonl").read_text()
    assert "hijacked" not in (o.run_dir / "instances" / "piqa.jsonl").read_text()
    assert all(r["predict_result"] for r in o.records("piqa"))


def test_a_writer_calling_sys_exit_is_left_out_and_the_run_resumes(gage, hostile):
    want = baseline(gage, hostile)
    o = gage("--tasks", "piqa", "--model", "dummy", "--writer", "hostile/exit:at=3", env=hostile)
    check(o, OK, "writer 'hostile/exit' failed in write() and is left out for the rest of the run: "
                 "it called sys.exit(7)", "--drop-writer hostile/exit")
    assert results(o) == want and o.summary["run"]["exit_status"] == o.rc == OK
    assert o.summary["run"]["writers_failed"] == {"hostile/exit": "it called sys.exit(7)"}
    run_dir = o.run_dir

    again = gage("--resume", run_dir, env=hostile)  # the stored writer fails again as it is rebuilt
    check(again, OK, "it called sys.exit(7)")
    assert results(again) == want

    without = {**hostile, "PYTHONPATH": os.pathsep.join(map(str, (GUARD, ROOT)))}
    refused = gage("--resume", run_dir, env=without)  # the plugin uninstalled: its writer is unknown
    check(refused, USAGE, "unknown writer 'hostile/exit'")

    dropped = gage("--resume", run_dir, "--drop-writer", "hostile/exit", env=without)
    check(dropped, OK)
    assert "writers_failed" not in dropped.summary["run"]
    assert "hostile/exit" not in dropped.text and results(dropped) == want
    assert json.loads((run_dir / "config.json").read_text())["writers"] == []

    later = gage("--resume", run_dir, env=hostile)  # dropped for good: later resumes leave it out
    check(later, OK)
    assert "sys.exit" not in later.text


def test_drop_writer_naming_no_writer_of_the_run_is_said(gage, hostile):
    o = gage("--tasks", "piqa", "--model", "dummy", "--writer", "hostile/mutate", "--drop-writer", "hostile/mutat",
             env=hostile)
    check(o, OK, "--drop-writer hostile/mutat: the run names no writer 'hostile/mutat' (its writers: hostile/mutate)")
    assert json.loads((o.run_dir / "config.json").read_text())["writers"] == ["hostile/mutate"]


def test_a_writer_failing_at_the_end_still_leaves_every_output(gage, hostile):
    o = gage("--tasks", "piqa", "--model", "dummy", "--writer", "hostile/raise", env=hostile)
    check(o, OK, "writer 'hostile/raise' failed in end()", "RuntimeError: end exploded")
    assert len(o.records("piqa")) == ROWS and (o.run_dir / "report.html").is_file()
    assert o.summary["run"]["writers_failed"] == {"hostile/raise": "RuntimeError: end exploded"}  # (written again)


# -- observers --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode, message", [
    ("exit", "observer hook gage_sample_done of plugin 'hostile' failed: it called sys.exit(9); its observers "
             "are left out for the rest of the run"),
    ("raise", "observer hook gage_sample_done of plugin 'hostile' failed: RuntimeError: observer exploded"),
    ("mutate", ""),
])
def test_an_observer_that_exits_raises_or_changes_its_event_changes_nothing(gage, hostile, mode, message):
    want = baseline(gage, hostile)
    o = gage("--tasks", "piqa", "--model", "dummy", env={**hostile, "HOSTILE_OBSERVER": mode})
    check(o, OK, message)
    assert results(o) == want
    assert o.text.count("observer hook") == (1 if message else 0)  # said once, then left out


# -- backend outputs --------------------------------------------------------------------------


@pytest.mark.parametrize("bad, why", [
    ("oops", "loglikelihoods is str, expected a list of 2 numbers"),
    ("short", "1 loglikelihoods for 2 continuations"),
    ("strings", "loglikelihoods[0] is str, expected a number"),
    ("bools", "loglikelihoods[0] is bool, expected a number"),
    ("nan_ll", "loglikelihoods[0] is nan, expected a finite number"),
    ("inf_ll", "loglikelihoods[0] is inf, expected a finite number"),
    ("neginf_ll", "loglikelihoods[0] is -inf, expected a finite number"),
    ("dict", "dict, not a ModelOutput"),
])
def test_a_malformed_loglikelihood_output_is_a_row_error(gage, hostile, bad, why):
    o = gage("--tasks", "piqa", "--model", "hostile", "--model-args", f"bad={bad}", env=hostile)
    check(o, ROW_ERRORS)
    records = o.records("piqa")
    assert len(records) == ROWS  # nothing dropped
    errors = o.errors("piqa")
    assert len(errors) == ROWS // BAD_EVERY == o.summary["tasks"]["piqa"]["counts"]["errored"]
    for err in errors.values():
        assert err["stage"] == "inference" and err["message"] == f"malformed backend output: {why}", err
    for r in records:  # an errored row is never scored
        assert ("error" in r["eval_result"]) != ("metrics" in r["eval_result"])


GEN_TASK = """\
name: gen
dataset: {loader: jsonl, args: {path: rows.jsonl}}
preprocessor: {name: identity}
request: {kind: generate, generation: {max_new_tokens: 8}}
metrics: [exact_match]
"""


@pytest.mark.parametrize("bad, why", [("text_int", "text is int, expected a string"),
                                      ("text_none", "text is NoneType, expected a string")])
def test_a_generate_output_without_text_is_a_row_error(gage, hostile, bad, why):
    folder = gage.tmp / "tasks" / "gen"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(GEN_TASK)
    data = gage.tmp / "data" / "rows.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps({"schema_version": "v1", "id": f"g{i}", "references": ["A"],
                                        "messages": [{"role": "user", "content": f"Say A {i}"}]}) + "\n"
                            for i in range(8)))
    o = gage("--tasks", "gen", "--model", "hostile", "--model-args", f"bad={bad}", "--include-path",
             gage.tmp / "tasks", "--data", f"gen={data}", env=hostile)
    check(o, ROW_ERRORS)
    assert len(o.records("gen")) == 8
    errors = o.errors("gen")
    assert [e["message"] for e in errors.values()] == [f"malformed backend output: {why}"] * 2
    assert o.summary["tasks"]["gen"]["counts"] == {"total": 8, "scored": 6, "errored": 2, "skipped": 0,
                                                   "judge_errors": 0}


def test_a_malformed_judge_reply_is_a_judge_row_error(gage, hostile):
    o = gage("--tasks", "legal_eval_v1", "--model", "dummy", "--judge-model", "hostile", "--judge-args",
             "bad=text_int,every=1", env=hostile)
    check(o, ROW_ERRORS)
    counts = o.summary["tasks"]["legal_eval_v1"]["counts"]
    assert len(o.records("legal_eval_v1")) == counts["total"] == 5  # 2 mcq rows need no judge
    assert counts["judge_errors"] == counts["errored"] == 3
    for err in o.errors("legal_eval_v1").values():
        assert err["stage"] == "judge" and "malformed backend output: text is int, expected a string" in err["message"]


# -- metrics and settings ---------------------------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_nan_or_infinite_metric_value_is_a_row_metric_error(gage, hostile, value):
    config = gage.tmp / "run.yaml"
    config.write_text("tasks:\n  - name: piqa\n    metrics: [acc, {name: hostile_value, args: "
                      f"{{value: '{value}', every: 6}}}}]\n")
    o = gage("--config", config, "--model", "dummy", env=hostile)
    check(o, ROW_ERRORS, "rows errored")
    assert len(o.records("piqa")) == ROWS
    errors = o.errors("piqa")
    assert len(errors) == ROWS // 6
    for err in errors.values():
        assert err["stage"] == "metric", err
        assert err["message"] == f"hostile_value: metric returned {float(value)}; a metric value must be a finite number"
    task = o.summary["tasks"]["piqa"]
    assert task["metrics"]["hostile_value"]["value"] == 1.0 and task["metrics"]["hostile_value"]["n"] == 20
    assert task["metrics"]["acc"]["value"] is not None and task["errors_by_stage"] == {"metric": 4}


def test_a_failing_settings_still_leaves_a_summary(gage, hostile):
    o = gage("--tasks", "piqa", "--model", "hostile", "--model-args", "settings_raise=true", env=hostile)
    check(o, OK, "warning: the model backend's settings() failed: RuntimeError: settings exploded")
    model = o.summary["run"]["model"]
    assert model["settings"] == {} and model["settings_error"] == "settings() failed: RuntimeError: settings exploded"
    assert len(o.records("piqa")) == ROWS and o.summary["tasks"]["piqa"]["counts"]["scored"] == ROWS


# -- plugins that do not load -----------------------------------------------------------------


def test_a_plugin_that_fails_to_import_is_recorded_in_the_summary(gage, hostile):
    """The run goes on without it, and summary.json says so: its name and why, credentials masked."""
    site = gage.tmp / "site"
    (site / "gage_broken.py").write_text('raise RuntimeError("cannot reach https://u:CANARY-PW@h/v1\\nsee above")\n')
    dist = site / "gage_broken-0.2.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gage-broken\nVersion: 0.2\n")
    (dist / "entry_points.txt").write_text("[gage_eval]\nbroken = gage_broken\n")
    o = gage("--tasks", "piqa", "--model", "dummy", "--limit", "3", env=hostile)
    check(o, OK, "plugin 'broken' failed to load: RuntimeError: cannot reach https://***@h/v1 see above")
    versions = o.summary["run"]["versions"]
    assert versions["plugins_failed"] == {"broken": "RuntimeError: cannot reach https://***@h/v1 see above"}
    assert "broken" not in versions["plugins"] and versions["plugins"]["hostile"] == "0.1"
    assert "CANARY-PW" not in o.text and "CANARY-PW" not in (o.run_dir / "summary.json").read_text()
    from gage_eval.api.schemas import validation_errors

    assert validation_errors(o.summary, "summary") == []


def test_a_stop_while_a_plugin_writer_ends_is_in_the_summary(gage, hostile):
    """SIGTERM after summary.json was written (a plugin writer's end still running): the summary
    says the run was stopped, as the exit status does, not that it finished."""
    import signal
    import subprocess
    import sys
    import time

    site = gage.tmp / "site"
    (site / "gage_slow.py").write_text(
        "import pathlib, time\nfrom gage_eval.api import Writer, hookimpl\n"
        "class SlowEnd(Writer):\n    def end(self, summary):\n"
        "        pathlib.Path('ending').touch()\n        time.sleep(30)\n"
        "@hookimpl\ndef gage_register_writers(register):\n    register('slow/end', SlowEnd)\n")
    dist = site / "gage_slow-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gage-slow\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[gage_eval]\nslow = gage_slow\n")
    run_dir = gage.tmp / "runs" / "r"
    proc = subprocess.Popen([sys.executable, "-m", "gage_eval.cli", "--tasks", "piqa", "--model", "dummy", "-q",
                             "--writer", "slow/end", "-o", str(run_dir.parent), "--run-id", "r"], cwd=gage.tmp,
                            env={**os.environ, **hostile, "HF_HUB_OFFLINE": "1"}, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not (gage.tmp / "ending").exists() and time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and b"Traceback" not in err, err
    run = json.loads((run_dir / "summary.json").read_text())["run"]
    assert (run["exit_status"], run["interrupted"]) == (143, "terminated (SIGTERM)")


def test_a_resume_after_the_plugin_of_a_stored_run_option_is_gone_says_so(gage, hostile):
    site = gage.tmp / "site"
    (site / "gage_opt.py").write_text("from gage_eval.api import hookimpl\n@hookimpl\ndef gage_register_options(register):\n"
                                      "    register('opt_level', '--opt-level', type='whole', default=1, help='x')\n")
    dist = site / "gage_opt-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gage-opt\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[gage_eval]\nopt = gage_opt\n")
    o = gage("--tasks", "piqa", "--model", "dummy", "--limit", "3", "--opt-level", "5", env=hostile)
    check(o, OK)
    (dist / "entry_points.txt").unlink()  # uninstalled
    check(gage("--resume", o.run_dir, env=hostile), USAGE, "unknown keys: opt_level; a run option of a plugin "
                                                          "not loaded now? install it again to resume")
