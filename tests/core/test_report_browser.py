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
