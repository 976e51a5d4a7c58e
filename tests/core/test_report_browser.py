"""report.html in a real headless browser (Debian's chromium and chromium-driver, driven by
Selenium) from file:// with the network off: the numbers shown equal summary.json's, search and
filters narrow the sample list, an MMMU sample shows its image, nothing is fetched.

The report is that of a real dummy-backend run of the golden slices (piqa, mmmu, docvqa,
legal_eval_v1 on ../shared/data). Skips, saying why, without the browser or the shared data;
.ci/run installs the browser with apt where it can."""
from __future__ import annotations

import json
import shutil
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"


def _browser() -> tuple[str, str] | None:
    chrome = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver") or ("/usr/lib/chromium/chromedriver"
                                              if Path("/usr/lib/chromium/chromedriver").exists() else None)
    return (chrome, driver) if chrome and driver else None


try:
    import selenium  # noqa: F401
    HAVE_SELENIUM = True
except ImportError:
    HAVE_SELENIUM = False

pytestmark = [
    pytest.mark.skipif(not HAVE_SELENIUM, reason="no selenium (pip install -e '.[test]')"),
    pytest.mark.skipif(_browser() is None, reason="no headless browser: install Debian's chromium and "
                                                  "chromium-driver (apt-get install -y chromium chromium-driver)"),
    pytest.mark.skipif(not (SHARED / "mmmu").is_dir(), reason="needs ../shared/data (mmmu, piqa, docvqa, legal)"),
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    sys.path.insert(0, str(ROOT / "tests" / "golden"))
    import golden

    return golden.run(SHARED, tmp_path_factory.mktemp("golden"))


@pytest.fixture(scope="module")
def driver(run_dir):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chrome, chromedriver = _browser()
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1300,2000", "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(chromedriver), options=opts)
    try:
        d.execute_cdp_cmd("Network.enable", {})
        d.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": True, "latency": 0, "downloadThroughput": 0,
                                                                "uploadThroughput": 0})
        d.get((run_dir / "report.html").as_uri())
        _wait(d, lambda: d.execute_script("return document.body.dataset.ready === '1'"))
        yield d
    finally:
        d.quit()


def _wait(d, predicate, timeout: float = 30):
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(d, timeout).until(lambda _: predicate())


def _set(d, element_id: str, value: str) -> None:
    d.execute_script("var e = document.getElementById(arguments[0]); e.value = arguments[1];"
                     "e.dispatchEvent(new Event(arguments[0] === 'q' ? 'input' : 'change'));", element_id, value)


def _matches(d) -> int:
    _wait(d, lambda: d.execute_script("return !!document.getElementById('list').dataset.matches"))
    return int(d.execute_script("return document.getElementById('list').dataset.matches"))


def _reset(d) -> None:
    for element_id in ("q", "f-status", "f-task", "f-slice"):
        _set(d, element_id, "")
    d.execute_script("window.gageReport.apply()")


def test_numbers_shown_equal_the_summary(driver, run_dir):
    from selenium.webdriver.common.by import By

    summary = json.loads((run_dir / "summary.json").read_text())
    seen = 0
    for cell in driver.find_elements(By.CSS_SELECTOR, "td[data-key]"):
        run, task, metric, field = cell.get_attribute("data-key").split("/", 3)
        if metric == "counts":
            assert cell.text == str(summary["tasks"][task]["counts"][field])
        elif field in ("value", "stderr", "n"):
            want = summary["tasks"][task]["metrics"][metric][field]
            assert cell.text == (f"{want:.4f}" if isinstance(want, float) else str(want)), (task, metric, field)
            assert float(cell.get_attribute("data-value")) == want
        else:
            continue
        seen += 1
    expected = sum(3 * len(t["metrics"]) + len(t["counts"]) for t in summary["tasks"].values())
    assert seen == expected > 0
    total = sum(t["counts"]["total"] for t in summary["tasks"].values())
    assert f"{total} of {total} samples" in driver.find_element(By.ID, "count").text


def test_search_and_filters_narrow_the_sample_list(driver, run_dir):
    from selenium.webdriver.common.by import By

    records = {}
    for path in (run_dir / "samples").glob("*.jsonl"):
        records[path.stem] = [json.loads(line) for line in path.read_text().splitlines()]
    total = sum(map(len, records.values()))
    _reset(driver)
    assert _matches(driver) == total
    assert len(driver.find_elements(By.CSS_SELECTOR, "#list details.sample")) == min(total, 50)

    _set(driver, "f-task", "mmmu")
    assert _matches(driver) == len(records["mmmu"]) == 19
    _set(driver, "f-slice", "subject=Economics")
    assert _matches(driver) == 7
    wrong = sum(1 for r in records["mmmu"] if r["data_tag"]["subject"] == "Economics"
                and not r["eval_result"]["overall"]["passed"])
    _set(driver, "f-status", "w")
    assert _matches(driver) == wrong
    _set(driver, "f-status", "c")
    assert _matches(driver) == 7 - wrong

    _reset(driver)
    _set(driver, "q", "guinea pig")  # piqa-0's question, typed as a person would (lower case)
    _wait(driver, lambda: _matches(driver) < total)
    ids = [e.get_attribute("data-id") for e in driver.find_elements(By.CSS_SELECTOR, "#list details.sample")]
    want = [r["id"] for r in records["piqa"] if "guinea pig" in json.dumps(r["messages"]).lower()]
    assert ids and sorted(ids) == sorted(want)
    _set(driver, "q", "no sample says this 7f3a")
    _wait(driver, lambda: _matches(driver) == 0)
    _reset(driver)


def test_an_mmmu_sample_shows_its_image(driver, tmp_path):
    from selenium.webdriver.common.by import By

    _reset(driver)
    _set(driver, "f-task", "mmmu")
    _set(driver, "q", "validation_accounting_1")
    _wait(driver, lambda: _matches(driver) == 1)
    card = driver.find_element(By.CSS_SELECTOR, "#list details.sample")
    card.find_element(By.TAG_NAME, "summary").click()
    _wait(driver, lambda: card.find_elements(By.CSS_SELECTOR, "img.thumb"))  # built when the card opens
    img = card.find_element(By.CSS_SELECTOR, "img.thumb")
    driver.execute_script("arguments[0].scrollIntoView()", img)
    _wait(driver, lambda: driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", img))
    width, height = driver.execute_script("return [arguments[0].naturalWidth, arguments[0].naturalHeight]", img)
    assert 50 <= max(width, height) <= 320
    assert img.get_attribute("src").startswith("data:image/jpeg;base64,")
    assert "Baxter Company" in card.text and "MODEL OUTPUT" in card.text.upper()
    shot = tmp_path / "mmmu_sample.png"
    assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    _reset(driver)


def test_the_page_works_offline(driver):
    resources = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert all(name.startswith(("data:", "file:")) for name in resources), resources
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    assert driver.execute_script("return navigator.onLine") is False  # it drew everything with the network off


# -- issue 28: intervals, data order, grouped errors, compare's side-by-side view -------------------------
@pytest.fixture(scope="module")
def edited(run_dir, tmp_path_factory) -> dict:
    """A copy of the golden run whose samples files are shuffled (as a concurrent run leaves them),
    whose legal rows all failed at the judge with a request UUID each, and whose piqa rows 0-4
    flipped; its report and the compare page of the two runs, written outside both folders."""
    from click.testing import CliRunner

    from gage_eval.cli import cli

    work = tmp_path_factory.mktemp("edited")
    copy = work / "copy"
    shutil.copytree(run_dir, copy)
    for path in (copy / "samples").glob("*.jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for r in records:
            result = r["eval_result"]
            if path.stem == "legal_eval_v1":
                r["eval_result"] = {"error": {"stage": "judge", "message": f"judge model: HTTP 500: request "
                                              f"{uuid.uuid4()} failed", "locator": "legal.jsonl:1"}}
            elif path.stem == "piqa" and int(r["id"].split("-")[1]) < 5:
                for m in result["metrics"].values():
                    m["value"] = 1.0 - m["value"]
                result["overall"].update(score=1.0 - result["overall"]["score"],
                                         passed=not result["overall"]["passed"])
        records.reverse()
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    runner = CliRunner()
    for args in (["report", str(copy), "-o", str(work / "edited.html")],
                 ["compare", str(run_dir), str(copy), "--task", "piqa", "--html", str(work / "compare.html")]):
        result = runner.invoke(cli, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
    return {"copy": copy, "report": work / "edited.html", "compare": work / "compare.html"}


def _open(d, page: Path, width: int = 1920) -> None:
    d.set_window_size(width, 1400)
    d.get(page.as_uri())
    _wait(d, lambda: d.execute_script("return document.readyState === 'complete'"))


def _fits(d) -> bool:
    return d.execute_script("return document.documentElement.scrollWidth <= document.documentElement.clientWidth")


def test_intervals_of_proportions_stay_in_zero_one(driver, run_dir):
    from selenium.webdriver.common.by import By

    summary = json.loads((run_dir / "summary.json").read_text())
    bounds = 0
    for cell in driver.find_elements(By.CSS_SELECTOR, "td[data-key$='/lo'], td[data-key$='/hi']"):
        _, task, metric, field = cell.get_attribute("data-key").split("/", 3)
        value = summary["tasks"][task]["metrics"][metric]["value"]
        x = float(cell.get_attribute("data-value"))
        assert 0.0 <= x <= 1.0 and (x <= value if field == "lo" else x >= value), (task, metric, field, x)
        bounds += 1
    assert bounds == 2 * sum(len(t["metrics"]) for t in summary["tasks"].values())
    slices = driver.execute_script("return Array.from(document.querySelectorAll('td[data-interval]'))"
                                   ".map(e => e.getAttribute('data-interval'))")
    assert len(slices) > 20  # mmmu's subjects, subfields, question types; docvqa's and legal's tags
    for pair in slices:
        lo, hi = map(float, pair.split(","))
        assert 0.0 <= lo <= hi <= 1.0, pair
    marks = driver.find_elements(By.CSS_SELECTOR, "table.metrics .smalln")
    assert len(marks) == sum(1 for t in summary["tasks"].values() for m in t["metrics"].values() if m["n"] < 30)


def test_samples_are_listed_in_data_order(driver, edited):
    from selenium.webdriver.common.by import By

    _open(driver, edited["report"])
    _wait(driver, lambda: driver.execute_script("return document.body.dataset.ready === '1'"))
    for task, want in (("piqa", [f"piqa-{i}" for i in range(20)]), ("legal_eval_v1", list(golden_legal_ids()))):
        _set(driver, "f-task", task)
        _wait(driver, lambda: _matches(driver) == len(want))
        ids = [e.get_attribute("data-id") for e in driver.find_elements(By.CSS_SELECTOR, "#list details.sample")]
        assert ids == want, task  # the samples files list them reversed
    _reset(driver)


def golden_legal_ids() -> tuple:
    sys.path.insert(0, str(ROOT / "tests" / "golden"))
    import golden

    return golden.LEGAL_IDS


def test_judge_errors_with_a_uuid_each_are_one_group(driver, edited):
    from selenium.webdriver.common.by import By

    _open(driver, edited["report"])
    section = driver.find_element(By.CSS_SELECTOR, "section[id='task-0-legal_eval_v1']")
    groups = section.find_elements(By.CSS_SELECTOR, "tr.error-group")
    assert len(groups) == 1
    cells = groups[0].find_elements(By.TAG_NAME, "td")
    assert cells[0].text == "13" and cells[1].text == "judge"
    assert cells[2].text.startswith("judge model: HTTP ‹n›: request ‹uuid› failed")
    assert cells[3].text.split(", ") == list(golden_legal_ids())  # every id, in data order
    assert _fits(driver)


def test_compare_opens_each_flipped_id_side_by_side_in_a_1920_window(driver, edited):
    from selenium.webdriver.common.by import By

    _open(driver, edited["compare"])
    assert _fits(driver)
    flips = driver.find_elements(By.CSS_SELECTOR, "details.flip")
    assert sorted(f.get_attribute("data-id") for f in flips) == sorted(
        [f"piqa-{i}" for i in range(5)] * 2)  # acc and acc_norm
    outer = flips[0].find_element(By.XPATH, "..")
    outer.find_element(By.TAG_NAME, "summary").click()
    flips[0].find_element(By.TAG_NAME, "summary").click()
    a, b = flips[0].find_elements(By.CSS_SELECTOR, ".sbs > div")
    assert a.is_displayed() and b.is_displayed()
    ra, rb = a.rect, b.rect
    assert abs(ra["y"] - rb["y"]) < 2 and ra["x"] + ra["width"] <= rb["x"]  # side by side, not stacked
    for side in (a, b):
        assert "SCORED CONTEXT" in side.text.upper() and "Question:" in side.text
        assert "LOG-LIKELIHOOD" in side.text.upper()
    assert _fits(driver)
    css = driver.execute_script("return getComputedStyle(document.querySelector('section.card')).borderRadius")
    assert css == "8px"  # the report's stylesheet
