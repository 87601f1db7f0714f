"""The dashboard in a real browser: headless Chromium from the operating system's packages
(`make test` installs it as root with apt; elsewhere these tests skip and say why), driven with
Selenium, against a `jetwake member start --metrics-port M --token T` process running a
windowed stream. The job list shows the job RUNNING, the job page draws its vertices and its
numbers move without a reload, a suspend clicked with a wrong token changes nothing, and with
the token the job is SUSPENDED in the page and in `jetwake status`.

Each test saves a screenshot of its page in its temporary folder; with
``JETWAKE_DASHBOARD_SCREENSHOTS=DIR`` they are also copied to DIR as ``dashboard-NAME.png``
(docs/images holds the ones docs/dashboard.md shows).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import pytest

from support.dashboard import TOKEN, DashboardMember
from support.waiting import stays_true, wait_until

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

try:
    from selenium import webdriver
    from selenium.common.exceptions import (
        ElementClickInterceptedException, StaleElementReferenceException, WebDriverException,
    )
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
except ImportError:  # pragma: no cover - the `test` extra installs it
    webdriver = None


def _missing() -> str | None:
    if webdriver is None:
        return "selenium is not installed (`make test` installs the test extra)"
    if CHROMIUM is None or CHROMEDRIVER is None:
        return ("no Chromium and chromedriver on PATH: `make test` installs the OS packages "
                "chromium and chromium-driver when run as root with apt; otherwise install "
                "them to run the dashboard's browser tests")
    return None


@pytest.fixture(scope="module")
def browser():
    why = _missing()
    if why:
        pytest.skip(why)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1360,1000", "--disable-extensions", "--no-first-run"):
        options.add_argument(arg)
    try:
        # the OS's chromedriver, named: Selenium fetches nothing
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    except WebDriverException as e:
        pytest.skip(f"Chromium did not start headless: {e.msg}")
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def member(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dashboard")
    m = DashboardMember(tmp)
    try:
        m.job = m.submit_stream(tmp, "windows")
        m.base = f"http://127.0.0.1:{m.metrics_port}"
        yield m
    finally:
        m.stop()


def screenshot(driver, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"dashboard-{name}.png"
    driver.save_screenshot(str(path))
    target = os.environ.get("JETWAKE_DASHBOARD_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / path.name)
    return path


def text_of(driver, css: str) -> str | None:
    """The text of the first element ``css`` selects; None while there is none (the page
    redraws its view every second, so an element may be replaced while it is read)."""
    try:
        found = driver.find_elements(By.CSS_SELECTOR, css)
        return found[0].text if found else None
    except StaleElementReferenceException:
        return None


def click(driver, css: str) -> None:
    def clicked() -> bool:
        try:
            driver.find_element(By.CSS_SELECTOR, css).click()
            return True
        except (StaleElementReferenceException, ElementClickInterceptedException):
            return False
        except WebDriverException:
            return False
    wait_until(clicked, what=f"a click on {css}", timeout=10, interval=0.05)


def use_token(driver, token: str) -> None:
    click(driver, "#token-button")
    field = driver.find_element(By.ID, "token-input")
    field.clear()
    field.send_keys(token)
    click(driver, "#token-save")
    wait_until(lambda: not driver.find_elements(By.CSS_SELECTOR, "dialog[open]"),
               what="the token dialog to close", timeout=5)


def open_job_page(driver, member) -> None:
    driver.get(f"{member.base}/jobs/{member.job['id']}")
    wait_until(lambda: text_of(driver, "#job-name") == "windows",
               what="the job page", timeout=15, interval=0.1)


def test_the_job_list_shows_the_job_running(browser, member, tmp_path):
    browser.get(member.base + "/")
    row = '#jobs tr[data-job-name="windows"]'
    wait_until(lambda: text_of(browser, row + " .status") == "RUNNING",
               what="the job RUNNING in the list", timeout=20, interval=0.1)
    assert text_of(browser, row + " .job-link") == "windows"
    wait_until(lambda: (text_of(browser, row + " .rate-in") or "0.0/s") != "0.0/s",
               what="a rate in", timeout=15, interval=0.1)
    screenshot(browser, tmp_path, "jobs")


def test_the_job_page_draws_its_vertices_and_edges(browser, member, tmp_path):
    browser.get(member.base + "/")
    click(browser, '#jobs tr[data-job-name="windows"] .job-link')
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "#dag g.vertex"),
               what="the graph", timeout=15, interval=0.1)
    detail = member.http.get(f"/api/jobs/{member.job['id']}").json
    names = [v["name"] for v in detail["dag"]["vertices"]]

    def drawn() -> list[str] | None:
        try:
            return [g.get_attribute("data-vertex")
                    for g in browser.find_elements(By.CSS_SELECTOR, "#dag g.vertex")]
        except StaleElementReferenceException:
            return None
    assert wait_until(lambda: drawn() == names and drawn(),
                      what="every vertex drawn", timeout=10, interval=0.1)
    edges = wait_until(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#dag g.edge")),
                       what="the edges", timeout=10, interval=0.1)
    assert edges == len(detail["dag"]["edges"])
    assert text_of(browser, "#job-status") == "RUNNING"
    screenshot(browser, tmp_path, "job")


def test_the_throughput_numbers_change_without_a_reload(browser, member, tmp_path):
    open_job_page(browser, member)
    browser.execute_script("window.__sameDocument = true;")  # gone if the page reloads
    cell = '#vertices tr[data-vertex="item-stream"] .items-out'
    first = wait_until(lambda: text_of(browser, cell),
                       what="the source's count", timeout=10, interval=0.1)
    second = wait_until(lambda: (lambda t: t if t and t != first else None)(
        text_of(browser, cell)), what="the count to change", timeout=10, interval=0.1)
    wait_until(lambda: (lambda t: t and t not in (first, second))(text_of(browser, cell)),
               what="the count to change again", timeout=10, interval=0.1)
    assert int(second.replace(",", "")) > int(first.replace(",", ""))
    rate = text_of(browser, '#vertices tr[data-vertex="item-stream"] .rate-out')
    assert rate.endswith("/s") and float(rate[:-2]) > 0
    assert browser.execute_script("return window.__sameDocument === true;")


def test_a_suspend_clicked_with_a_wrong_token_changes_nothing(browser, member, tmp_path):
    open_job_page(browser, member)
    use_token(browser, "not-the-token")
    click(browser, "#action-suspend")
    click(browser, "#confirm-ok")
    wait_until(lambda: "403" in (text_of(browser, "#notice") or ""),
               what="the refusal", timeout=10, interval=0.1)
    assert "wrong token" in text_of(browser, "#notice")
    screenshot(browser, tmp_path, "refused")
    # nothing happens: the page and the member keep saying RUNNING
    stays_true(lambda: text_of(browser, "#job-status") in ("RUNNING", None), seconds=2,
               interval=0.1, what="the page saying RUNNING")
    assert member.status("windows") == "RUNNING"
    assert "dashboard: suspend of job" in member.log and "wrong token" in member.log


def test_a_suspend_clicked_with_the_token_suspends_the_job(browser, member, tmp_path):
    open_job_page(browser, member)
    use_token(browser, TOKEN)
    wait_until(lambda: text_of(browser, "#auth-state") == "token accepted",
               what="the token", timeout=5)
    click(browser, "#action-suspend")
    assert "terminal snapshot" in text_of(browser, "#confirm-text")
    click(browser, "#confirm-ok")
    wait_until(lambda: text_of(browser, "#job-status") == "SUSPENDED",
               what="SUSPENDED in the page", timeout=20, interval=0.1)
    assert member.status("windows") == "SUSPENDED"
    screenshot(browser, tmp_path, "suspended")


def test_the_cluster_and_snapshots_pages_and_a_404_page(browser, member, tmp_path):
    # an export from the job page shows on the snapshots page
    open_job_page(browser, member)
    use_token(browser, TOKEN)
    click(browser, "#action-export")
    field = browser.find_element(By.ID, "confirm-name")
    field.clear()
    field.send_keys("windows-export")
    click(browser, "#confirm-ok")
    wait_until(lambda: "requested" in (text_of(browser, "#notice") or ""),
               what="the export", timeout=20)
    browser.get(member.base + "/snapshots")
    wait_until(lambda: text_of(browser, '#snapshots tr[data-snapshot="windows-export"]'),
               what="the exported snapshot listed", timeout=10, interval=0.1)
    screenshot(browser, tmp_path, "snapshots")

    browser.get(member.base + "/cluster")
    wait_until(lambda: text_of(browser, "#cluster-state") == "ACTIVE",
               what="the cluster", timeout=10, interval=0.1)
    row = wait_until(lambda: text_of(browser, "#members tbody tr"),
                     what="the member row", timeout=10, interval=0.1)
    assert member.address in row and "MB" in row
    screenshot(browser, tmp_path, "cluster")

    browser.get(member.base + "/jobs/no-such-job")
    assert browser.find_element(By.TAG_NAME, "h1").text == "No such job"
    assert "no-such-job" in browser.find_element(By.ID, "message").text
    screenshot(browser, tmp_path, "not-found")


@contextlib.contextmanager
def job_page(browser, member, tmp_path, name: str, job_py: str, *submit_args: str):
    """Submits the job file ``job_py`` as ``name`` to ``member``, opens its page in
    ``browser``, and cancels the job when done; yields the job's description."""
    path = tmp_path / f"{name}_job.py"
    path.write_text(job_py)
    r = member.cli("submit", str(path), "--name", name, *submit_args, "--json")
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    job = json.loads(r.stdout)
    try:
        browser.get(f"{member.base}/jobs/{job['id']}")
        yield job
    finally:
        member.cli("cancel", job["id"])


def row_cells(browser, selector: str) -> list[str] | None:
    """The texts of the cells ``selector`` finds, or None while there are none (or the
    page is redrawing them)."""
    try:
        return [c.text for c in browser.find_elements(By.CSS_SELECTOR, selector)] or None
    except StaleElementReferenceException:
        return None


SERVICE_JOB_PY = '''
import asyncio
from jetwake import Pipeline, ServiceFactory, Sinks, TestSources

async def slow(service, x):
    await asyncio.sleep(0.03)
    return x

pipeline = Pipeline()
(pipeline.read_from(TestSources.item_stream(100, lambda ts, seq: seq))
    .map_using_service_async(ServiceFactory(dict), slow).set_name("enrich")
    .write_to(Sinks.noop()))
'''


def test_the_job_page_shows_service_calls_with_latency_percentiles(browser, member, tmp_path):
    with job_page(browser, member, tmp_path, "services", SERVICE_JOB_PY):
        # vertex, calls, in flight, retries, failures, latency p50, p95, p99
        selector = '#service-calls tr[data-vertex="enrich"] td'
        row = wait_until(lambda: (c := row_cells(browser, selector)) and c[5].endswith(" ms")
                         and c, what="the service calls row with its percentiles",
                         timeout=20, interval=0.1)
        assert row[0] == "enrich" and int(row[1].replace(",", "")) > 0
        assert 30 <= int(row[5].split()[0]) <= int(row[7].split()[0])
        screenshot(browser, tmp_path, "service-calls")


JOIN_JOB_PY = '''
from jetwake import Pipeline, Sinks, TestSources

pipeline = Pipeline()
left = pipeline.read_from(TestSources.item_stream(200, lambda ts, seq: (seq % 10, seq)))
right = pipeline.read_from(TestSources.item_stream(200, lambda ts, seq: (seq % 10, -seq)))
(left.with_native_timestamps(0)
    .join_interval(right.with_native_timestamps(0), lambda e: e[0], lambda e: e[0], -50, 50)
    .set_name("clicks-views").write_to(Sinks.noop()))
'''


def test_the_job_page_shows_the_join_state_of_a_join_of_two_streams(browser, member, tmp_path):
    with job_page(browser, member, tmp_path, "joins", JOIN_JOB_PY):
        # vertex, table entries, hits, misses, updates, deletes, join state entries, pairs,
        # evicted: the pairs and the evicted entries grow as the watermark moves on
        selector = '#join-state tr[data-vertex="clicks-views"] td'
        row = wait_until(lambda: (c := row_cells(browser, selector)) and c[7] not in ("–", "0")
                         and c[8] not in ("–", "0") and c, timeout=20, interval=0.1,
                         what="the join's row with pairs and evicted entries")
        assert row[0] == "clicks-views" and row[1] == "–"  # no table in this stage
        assert int(row[6].replace(",", "")) >= 0
        screenshot(browser, tmp_path, "join-state")


STATE_JOB_PY = '''
from jetwake import AggregateOperations, Pipeline, Sinks, TestSources

pipeline = Pipeline()
(pipeline.read_from(TestSources.item_stream(500, lambda ts, seq: (f"user-{seq % 5}", 1)))
    .group_by(lambda kv: kv[0])
    .rolling_aggregate(AggregateOperations.summing(lambda kv: kv[1])).set_name("visits")
    .write_to(Sinks.noop()))
'''


def test_the_job_page_lists_the_stateful_stages_and_looks_a_key_up(browser, member, tmp_path):
    with job_page(browser, member, tmp_path, "visits", STATE_JOB_PY, "--guarantee",
                  "exactly_once", "--snapshot-interval", "200"):
        # stage, kind, keys, bytes, snapshot: five keys once a snapshot has committed
        selector = '#state-stages tr[data-stage="visits"] td'
        row = wait_until(lambda: (c := row_cells(browser, selector)) and c[2] == "5" and c,
                         timeout=30, interval=0.1, what="the visits stage with its 5 keys")
        assert row[1] == "rolling_aggregate" and row[4].startswith("#")
        field = browser.find_element(By.CSS_SELECTOR, "#state-key")
        field.send_keys("user-3")
        click(browser, "#state-lookup-button")

        def result() -> str | None:
            try:
                return browser.find_element(By.CSS_SELECTOR, "#state-result").text
            except (WebDriverException, StaleElementReferenceException):
                return None
        text = wait_until(lambda: (t := result()) and "user-3" in t and t, timeout=20,
                          interval=0.1, what="the lookup's answer")
        total = int(text.rsplit(":", 1)[1])
        assert total > 0, text
        click(browser, "#state-latest")
        click(browser, "#state-lookup-button")
        live = wait_until(lambda: (t := result()) and "live state" in t and t, timeout=20,
                          interval=0.1, what="the live lookup's answer")
        assert int(live.rsplit(":", 1)[1]) >= total
        screenshot(browser, tmp_path, "state")
