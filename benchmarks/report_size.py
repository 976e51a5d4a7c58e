"""report.html at scale: file size, time to write it, and time to first paint in headless Chromium.

Runs the dummy backend on N synthetic piqa rows (1k, 10k, 100k by default; --no-report, so the
run itself is not timed here), writes the report with ``gage-eval report``'s function, then
opens it from file:// in headless chromium (Selenium, network off) and reads the page's
first-contentful-paint and the moment the first page of samples was drawn (the
``samples-drawn`` mark). Needs Debian's chromium and chromium-driver, and selenium.

    python benchmarks/report_size.py [--rows 1000,10000,100000] [--out benchmarks/out/report_size]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rows_file(path: Path, n: int) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"goal": f"How do I do thing {i} with the tools at hand?",
                                 "sol1": f"Use the tool number {i} and then put it back.",
                                 "sol2": f"Use the other tool {i * 3} and leave it out.", "label": i % 2}) + "\n")
    return path


def run(n: int, out: Path) -> Path:
    from click.testing import CliRunner

    from gage_eval.cli import cli

    data = rows_file(out / f"piqa-{n}.jsonl", n)
    args = ["--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}", "-o", str(out / "runs"),
            "--run-id", f"n{n}", "-q", "--no-report"]
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return out / "runs" / f"n{n}"


def paint(page: Path) -> dict:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1300,1000"):
        opts.add_argument(arg)
    d = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    try:
        d.execute_cdp_cmd("Network.enable", {})
        d.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": True, "latency": 0,
                                                                "downloadThroughput": 0, "uploadThroughput": 0})
        t0 = time.perf_counter()
        d.set_page_load_timeout(300)
        d.get(page.as_uri())
        load_wall = time.perf_counter() - t0
        got = d.execute_script(
            "var p = performance.getEntriesByName('first-contentful-paint')[0];"
            "var m = performance.getEntriesByName('samples-drawn')[0];"
            "var t0 = performance.now(); window.gageReport.apply(); document.getElementById('q').value = 'thing 77';"
            "window.gageReport.apply(); var search = performance.now() - t0;"
            "return [p ? p.startTime : null, m ? m.startTime : null, search,"
            " document.getElementById('list').dataset.matches];")
        return {"fcp_ms": got[0], "samples_drawn_ms": got[1], "filter_and_search_ms": got[2],
                "search_matches": int(got[3]), "load_wall_s": load_wall}
    finally:
        d.quit()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1000,10000,100000")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "report_size"))
    a = ap.parse_args()
    out = Path(a.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    from gage_plugins_builtin.report.page import render_report

    for n in (int(x) for x in a.rows.split(",")):
        run_dir = run(n, out)
        t0 = time.perf_counter()
        page = render_report([run_dir], run_dir / "report.html")
        write_s = time.perf_counter() - t0
        result = {"rows": n, "bytes": page.stat().st_size, "write_s": round(write_s, 2), **paint(page)}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
