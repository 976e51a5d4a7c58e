"""Screenshots of report.html and ``compare --html`` in headless Chromium, on real rows.

    python benchmarks/report_screenshots.py [--out DIR] [--shared ../shared/data]

Runs gage-eval with the dummy backend (the pages are what is looked at, not the model) on real
rows of ../shared/data, then takes 1,920 px wide screenshots of:

* piqa (60 dev rows): intervals, the log-likelihood view of a sample (context, every choice's
  log-likelihood and normalised one, the choice each metric took), samples in data order;
* mmmu (Accounting, Economics and Finance validation shards): per-slice plots with small-n
  marks, an image sample, the fallback counter in words (the dummy answers a sentence that
  names no letter);
* legal_eval_v1 (the shared rows) judged through a local OpenAI-compatible stand-in that refuses
  every judge call with its own request UUID: the errors make one group;
* two piqa runs, 0-shot and 2-shot (examples drawn from other dev rows), on one page: what
  differs, the combined plot;
* ``compare`` of those two runs: one style with the report, a flipped id opened side by side.

Each page is also checked for horizontal overflow at 1,920 px (``scrollWidth``); the figures
are printed. Needs chromium, chromium-driver and selenium (the tests' ``.[test]`` extra).
"""
from __future__ import annotations

import argparse
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 1920
MAX_HEIGHT = 2400  # a page's screenshot: its top (the samples list below goes on)


def gage(*args: object, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "gage_eval.cli", *map(str, args)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **(env or {})})
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


class _RefusingJudge(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible stand-in: lists one model, refuses each completion with a request UUID."""

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._send(200, {"object": "list", "data": [{"id": "judge-m", "object": "model"}]})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(400, {"error": {"message": f"request {uuid.uuid4()} was rejected by the content filter",
                                   "type": "invalid_request_error"}})

    def log_message(self, *args: object) -> None:
        pass


def make_runs(shared: Path, work: Path) -> dict[str, Path]:
    runs = work / "runs"
    piqa = shared / "piqa" / "derived" / "validation.jsonl"
    rows = [line for line in piqa.read_text(encoding="utf-8").splitlines() if line.strip()]
    dev = work / "piqa-dev.jsonl"
    dev.write_text("\n".join(rows[:60]) + "\n", encoding="utf-8")
    # piqa's few-shot source is its train split (the hub); offline, a copy of the task folder
    # draws its examples from other dev rows (fewshot: path), for both runs alike
    folder = work / "tasks" / "piqa"
    shutil.copytree(ROOT / "tasks" / "piqa", folder)
    (folder / "fewshot.jsonl").write_text("\n".join(rows[100:140]) + "\n", encoding="utf-8")
    spec = (folder / "task.yaml").read_text(encoding="utf-8")
    (folder / "task.yaml").write_text(spec.replace("  split: train\n", "  path: fewshot.jsonl\n"), encoding="utf-8")
    out = {}
    for shots in (0, 2):
        gage("--tasks", "piqa", "--include-path", folder.parent, "--model", "dummy", "--data", f"piqa={dev}",
             "--num-fewshot", shots, "-o", runs, "--run-id", f"piqa-{shots}shot", "-q")
    out["piqa"], out["piqa_b"] = runs / "piqa-0shot", runs / "piqa-2shot"
    mmmu = work / "mmmu"
    mmmu.mkdir()
    for subject in ("Accounting", "Economics", "Finance"):
        os.symlink(shared / "mmmu" / subject / "validation-00000-of-00001.parquet",
                   mmmu / f"{subject}-validation-00000-of-00001.parquet")
    gage("--tasks", "mmmu", "--model", "dummy", "--model-args", "response=fixed,text=It is hard to say.",
         "--data", f"mmmu={mmmu}", "-o", runs, "--run-id", "mmmu", "-q")
    out["mmmu"] = runs / "mmmu"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RefusingJudge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        legal = shared / "legal_eval_v1" / "data" / "for_eval" / "merged_legal_eval_v1.jsonl"
        gage("--tasks", "legal_eval_v1", "--model", "dummy", "--model-args", "response=echo", "--judge-model", "openai",
             "--judge-args", f"base_url=http://127.0.0.1:{server.server_address[1]}/v1,model=judge-m,max_retries=0",
             "--data", f"legal_eval_v1={legal}", "--max-error-rate", "1", "-o", runs, "--run-id", "legal", "-q",
             env={"NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"})
    finally:
        server.shutdown()
    out["legal"] = runs / "legal"
    return out


def driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chrome = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    chromedriver = shutil.which("chromedriver") or "/usr/lib/chromium/chromedriver"
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={WIDTH},1200", "--hide-scrollbars"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(chromedriver), options=opts)


def shoot(d, page: Path, png: Path, prepare: str = "", element: str | None = None) -> dict:
    """Open ``page`` in a 1,920 px window, run ``prepare`` (JavaScript), screenshot the whole page
    (or only the ``element``, a CSS selector); returns the page's scrollWidth and clientWidth."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    d.set_window_size(WIDTH, 1200)
    d.get(page.as_uri())
    WebDriverWait(d, 30).until(lambda _: d.execute_script(
        "return document.readyState === 'complete' && (!document.getElementById('report-data') "
        "|| document.body.dataset.ready === '1')"))
    if prepare:
        d.execute_script(prepare)
    widths = d.execute_script("return {scroll: document.documentElement.scrollWidth, "
                              "client: document.documentElement.clientWidth}")
    full = d.execute_script("return document.documentElement.scrollHeight")
    d.set_window_size(WIDTH, min(full, MAX_HEIGHT))
    if element:
        d.find_element(By.CSS_SELECTOR, element).screenshot(str(png))
    else:
        d.save_screenshot(str(png))
    return widths


OPEN_FIRST_SAMPLE = "var c = document.querySelector('#list details.sample'); c.open = true;"
OPEN_RUN_TABLES = "document.querySelectorAll('section.run details').forEach(d => { d.open = true; });"
OPEN_A_FLIP = "var f = document.querySelector('details.flip'); f.parentElement.open = true; f.open = true;"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "gage-report-screenshots")
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gage-shots-"))
    runs = make_runs(args.shared, work)
    pages = args.out / "pages"
    pages.mkdir(exist_ok=True)
    gage("report", runs["piqa"], runs["piqa_b"], "-o", pages / "two_runs.html")
    gage("compare", runs["piqa"], runs["piqa_b"], "--html", pages / "compare.html")
    shots = [  # name, page, JavaScript run first, the element shot (None: the page's top)
        ("piqa", runs["piqa"] / "report.html", "", None),
        ("piqa_sample", runs["piqa"] / "report.html", OPEN_FIRST_SAMPLE, "#list details.sample"),
        ("piqa_settings", runs["piqa"] / "report.html", OPEN_RUN_TABLES, "section.run"),
        ("mmmu", runs["mmmu"] / "report.html", "", None),
        ("mmmu_sample", runs["mmmu"] / "report.html", OPEN_FIRST_SAMPLE, "#list details.sample"),
        ("legal", runs["legal"] / "report.html", "", None),
        ("two_runs", pages / "two_runs.html", "", None),
        ("compare", pages / "compare.html", OPEN_A_FLIP, None),
        ("compare_flip", pages / "compare.html", OPEN_A_FLIP, "details.flip"),
    ]
    d = driver()
    try:
        for name, page, prepare, element in shots:
            png = args.out / f"{name}.png"
            widths = shoot(d, page, png, prepare, element)
            fits = "fits" if widths["scroll"] <= WIDTH else "OVERFLOWS"
            print(f"{png}: scrollWidth {widths['scroll']} px in a {WIDTH} px window ({fits})")
    finally:
        d.quit()


if __name__ == "__main__":
    main()
