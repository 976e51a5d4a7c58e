"""report.html (the builtin plugin's report, gage_plugins_builtin/report/): written at the end of every run unless --no-report, its
numbers equal summary.json's, a run stopped early still gets one, secrets never reach it, a
failing report never loses the run; ``gage-eval report`` puts several runs side by side; MMMU
images come back as embedded thumbnails."""
from __future__ import annotations

import html
import json
import re
import signal
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gage_plugins_builtin.report import writer as report_writer
from gage_plugins_builtin.report.command import report_command

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"


def embedded(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', text, re.S)
    assert m, "no embedded data"
    return json.loads(m.group(1))


def shown(path: Path) -> dict[str, tuple[str, str]]:
    """data-key -> (data-value, the text shown) of every keyed cell."""
    text = path.read_text(encoding="utf-8")
    cells = re.findall(r'data-key="([^"]+)" data-value="([^"]*)">([^<]*)<', text)
    return {html.unescape(k): (v, html.unescape(t)) for k, v, t in cells}


def piqa_run(run_cli, tmp_path: Path, *extra) -> Path:
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", "20", "-o", tmp_path / "runs",
                     "--run-id", "r", "-q", *extra)
    assert result.exit_code == 0, result.output
    return tmp_path / "runs" / "r"


def test_report_is_written_at_run_end_and_its_numbers_equal_the_summary(run_cli, tmp_path):
    run_dir = piqa_run(run_cli, tmp_path)
    page = run_dir / "report.html"
    assert page.is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    data = embedded(page)
    assert data["summaries"] == [summary]
    assert len(data["samples"]) == summary["tasks"]["piqa"]["counts"]["total"] == 20
    cells = shown(page)
    for name, m in summary["tasks"]["piqa"]["metrics"].items():
        for field, want in (("value", m["value"]), ("stderr", m["stderr"]),  # the interval: summary.json's bootstrap
                            ("lo", m["ci95"]["bootstrap"][0]), ("hi", m["ci95"]["bootstrap"][1])):
            value, text = cells[f"0/piqa/{name}/{field}"]
            assert float(value) == pytest.approx(want, abs=0, rel=1e-15) and text == f"{want:.4f}"
        assert cells[f"0/piqa/{name}/n"] == (str(m["n"]), str(m["n"]))
    for k, v in summary["tasks"]["piqa"]["counts"].items():
        assert cells[f"0/piqa/counts/{k}"] == (str(v), str(v))
    statuses = {s["s"] for s in data["samples"]}
    assert statuses <= {"c", "w"} and statuses
    correct = sum(s["s"] == "c" for s in data["samples"])
    assert correct == round(summary["tasks"]["piqa"]["metrics"]["acc"]["value"] * 20)
    text = page.read_text()
    assert "http://" not in text and "https://" not in text  # nothing fetched: works offline
    assert "<svg" in text


def test_no_report_flag_and_run_config_key_skip_it(run_cli, tmp_path):
    assert not (piqa_run(run_cli, tmp_path, "--no-report") / "report.html").exists()
    cfg = tmp_path / "run.yaml"
    cfg.write_text("tasks: [piqa]\nreport: false\n")
    result = run_cli("--config", cfg, "--model", "dummy", "--limit", "5", "-o", tmp_path / "cfg", "--run-id", "c", "-q")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cfg" / "c" / "summary.json").is_file() and not (tmp_path / "cfg" / "c" / "report.html").exists()


def test_a_failing_report_warns_and_keeps_the_run(run_cli, tmp_path, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("template exploded")

    monkeypatch.setattr(report_writer, "render_report", broken)
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", "5", "-o", tmp_path / "runs", "--run-id", "r",
                     "-q")
    assert result.exit_code == 0, result.output
    assert "report.html was not written (RuntimeError: template exploded)" in result.stderr
    assert "Traceback" not in result.stderr
    run_dir = tmp_path / "runs" / "r"
    assert json.loads((run_dir / "summary.json").read_text())["tasks"]["piqa"]["counts"]["total"] == 5
    assert not (run_dir / "report.html").exists()


def test_secrets_never_reach_the_report(run_cli, tmp_path):
    result = run_cli("--tasks", "piqa", "--model", "openai", "--model-args",
                     "base_url=http://user:canary-pw-91c@127.0.0.1:9/v1,model=m,header_X-Token=canary-hdr-22b,"
                     "max_retries=0", "--limit", "3", "-o", tmp_path / "runs", "--run-id", "s", "-q")
    assert result.exit_code == 3, result.output  # every request refused: the task fails, the run is kept
    page = tmp_path / "runs" / "s" / "report.html"
    text = page.read_text()
    assert "canary" not in text
    assert '"header_X-Token":"***"' in text  # the masked settings are there
    data = embedded(page)
    assert {s["s"] for s in data["samples"]} == {"e"}
    assert "Cannot connect to host" in text and "errored" in text  # the errors, grouped by message
    groups = [int(n) for n in re.findall(r'<td class="num">(\d+)</td><td>inference</td>', text)]
    assert groups and sum(groups) == 3, groups  # each row under its message


def test_a_run_stopped_early_still_gets_a_report(tmp_path):
    import subprocess
    import time

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"goal": f"How do I do thing {i}?", "sol1": f"Use the tool {i}.",
                                        "sol2": f"Use the other tool {i}.", "label": i % 2}) + "\n"
                            for i in range(200)))
    proc = subprocess.Popen([sys.executable, "-c", "from gage_eval.cli import main; main()", "--tasks", "piqa",
                             "--model", "dummy", "--model-args", "delay_ms=20", "--batch-size", "4",
                             "--data", f"piqa={rows}", "-o", str(tmp_path), "--run-id", "r"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    samples = tmp_path / "r" / "samples" / "piqa.jsonl"
    deadline = time.time() + 120
    while not (samples.exists() and samples.read_bytes().count(b"\n") >= 12):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    data = embedded(tmp_path / "r" / "report.html")
    assert data["summaries"] == [summary] and summary["run"]["interrupted"]
    assert len(data["samples"]) == summary["tasks"]["piqa"]["counts"]["total"] < 200
    assert "interrupted:" in (tmp_path / "r" / "report.html").read_text()


def test_report_command_puts_runs_side_by_side(run_cli, tmp_path):
    a = piqa_run(run_cli, tmp_path / "a", "--no-report")
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--model-args", "seed=7", "--limit", "20",
                     "-o", tmp_path / "b", "--run-id", "other", "-q", "--no-report")
    assert result.exit_code == 0, result.output
    b = tmp_path / "b" / "other"
    out = tmp_path / "both.html"
    res = CliRunner().invoke(report_command, [str(a), str(b), "-o", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert f"wrote {out}" in res.output
    size = re.search(r"\((\d+(?:\.\d)?) (kB|MB)\)", res.output)  # a size a person reads: never "(0.0 MB)"
    assert size and float(size[1]) > 0 and out.stat().st_size == pytest.approx(float(size[1]) * (1e3 if size[2] == "kB" else 1e6), rel=0.1)
    text = out.read_text()
    assert 'id="compare"' in text and re.search(r'<th class="num">.*?r<br>.*?<th class="num">.*?other<br>', text)
    # what differs is named: the model's seed (the only setting changed), n-shot not (the same)
    differ = re.search(r'<div id="differ-line">(.*?)</div>', text, re.S).group(1)
    assert "model.args.seed" in differ and "model.settings.seed" in differ and "n-shot" not in differ
    rows = dict(re.findall(r'<tr class="differ"><td><code>([^<]+)</code></td>(.*?)</tr>', text))
    assert re.findall(r"<td>([^<]*)</td>", rows["model.args.seed"]) == ["(absent)", "7"]
    assert re.findall(r"<td>([^<]*)</td>", rows["model.settings.seed"]) == ["1234", "7"]
    assert 'id="combined-plot"' in text and text.count('<rect class="run1') >= 2  # both runs' bars
    cells = shown(out)
    for i, run_dir in enumerate((a, b)):
        summary = json.loads((run_dir / "summary.json").read_text())
        for name, m in summary["tasks"]["piqa"]["metrics"].items():
            assert float(cells[f"{i}/piqa/{name}/value"][0]) == m["value"]
    data = embedded(out)
    assert [r["id"] for r in data["runs"]] == ["r", "other"] and len(data["samples"]) == 40
    # one run: RUN_DIR/report.html by default
    res = CliRunner().invoke(report_command, [str(a)], catch_exceptions=False)
    assert res.exit_code == 0 and (a / "report.html").is_file()


def test_report_command_refuses_a_folder_that_is_no_run(tmp_path):
    from gage_eval.api.errors import GageError

    with pytest.raises(GageError, match="no summary.json there; is it a gage-eval run folder"):
        CliRunner().invoke(report_command, [str(tmp_path)], catch_exceptions=False)
    with pytest.raises(GageError, match="no such run folder"):
        CliRunner().invoke(report_command, [str(tmp_path / "missing")], catch_exceptions=False)


def test_the_template_ships_in_the_package():
    from importlib.resources import files

    assert files("gage_plugins_builtin.report").joinpath("templates", "report.html.jinja").is_file()


@pytest.mark.skipif(not (SHARED / "mmmu").is_dir(), reason="needs ../shared/data (mmmu)")
def test_mmmu_images_come_back_as_thumbnails(tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "golden"))
    import golden

    run_dir = golden.run(SHARED, tmp_path)
    data = embedded(run_dir / "report.html")
    mmmu = [s for s in data["samples"] if s["t"] == "mmmu"]
    keys = [p["k"] for s in mmmu for m in s["m"] for p in m[1] if isinstance(p, dict)]
    assert len(mmmu) == 19 and len(keys) >= 19
    assert all(data["images"][k].startswith("data:image/jpeg;base64,") for k in keys)
    docvqa = [p["k"] for s in data["samples"] if s["t"] == "docvqa" for m in s["m"] for p in m[1]
              if isinstance(p, dict)]
    assert docvqa and all(k in data["images"] for k in docvqa)
    legal = [s for s in data["samples"] if s["t"] == "legal_eval_v1" and "j" in s]
    assert legal and all(s["j"].get("raw") or s["j"].get("details") for s in legal)  # the judge's verdict
