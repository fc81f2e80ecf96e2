"""The Dagster UI as a user meets it: headless Chromium (Debian's) driven by Playwright.

Starts ``make ui``'s launcher (goblin_assets/ui.py: ``dagster dev`` on the project's workspace,
runs kept small through the ``GOBLIN_RUNNER_*`` variables) on a fresh instance, opens the asset
lineage, then does what README.md's "Audit a new workload from the UI" says: opens the
``audit_workload`` job, picks the ``digits_mlp`` partition and launches one run, once the daemon
has built the knowledge base (nothing else builds it here).  Waits for the run to succeed, opens
the waste budget's asset checks and the audit report's metadata, and saves screenshots (to
``$GOBLIN_SCREENSHOTS``, default ``screenshots/`` under the suite's own ``GOBLIN_HOME``, never the
checkout's ``.goblin``); ``docs/ui_audit_workload.png`` is its ``03_launch_dialog.png``, cropped to the dialog.

Skipped only when ``GOBLIN_SKIP_BROWSER=1``; CI runs it (``make test`` installs
Chromium from Debian's packages).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("GOBLIN_SKIP_BROWSER") == "1", reason="GOBLIN_SKIP_BROWSER=1"),
]

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphql(url: str, query: str) -> dict:
    req = urllib.request.Request(f"{url}/graphql", data=json.dumps({"query": query}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["data"]


#: The smallest runs that still measure a data-loader-bound step and both benchmark arms: this test checks the UI
#: flow (launch, run, checks, report), not the size of the speedup (tests/test_defs.py and test_audit_e2e do that).
SMALL_RUNS = {"GOBLIN_RUNNER_PROFILED_STEPS": "1", "GOBLIN_RUNNER_WARMUP_STEPS": "1", "GOBLIN_RUNNER_BENCH_STEPS": "2",
              "GOBLIN_RUNNER_BENCH_REPEATS": "1", "GOBLIN_RUNNER_SKETCH_STEPS": "1"}


@pytest.fixture
def dagster_ui(tmp_path, monkeypatch, loader_rule_kb):
    """``make ui``'s launcher on a fresh instance; the rules are the shipped ones with the loader rule firing on
    any data wait (``GOBLIN_KB``), so a loaded machine still gets the digits patch the test reads."""
    import dagster as dg

    home = tmp_path / "home"
    dagster_home = home / "dagster"
    dagster_home.mkdir(parents=True)
    (dagster_home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\nconcurrency:\n  pools:\n    default_limit: 1\n")
    env = {**os.environ, "GOBLIN_HOME": str(home), "DAGSTER_HOME": str(dagster_home), **SMALL_RUNS,
           "GOBLIN_KB": str(loader_rule_kb)}
    monkeypatch.setenv("GOBLIN_HOME", str(home))
    # Create (and migrate) the instance's storage before `dagster dev` opens it: two processes creating the same
    # fresh SQLite storage at once race on its schema version.
    inst = dg.DagsterInstance.from_config(str(dagster_home))
    inst.add_dynamic_partitions("workloads", ["digits_mlp"])
    port = _free_port()
    log = open(tmp_path / "dagster_dev.log", "wb")
    inst.dispose()
    # what `make ui` runs: the launcher, which stops dagster dev's whole process group on SIGTERM
    proc = subprocess.Popen([sys.executable, "-m", "goblin_assets.ui", "--host", "127.0.0.1", "--port", str(port)],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 240
        while True:
            try:
                urllib.request.urlopen(f"{url}/server_info", timeout=5)
                status = _graphql(url, "{ workspaceOrError { ... on Workspace { locationEntries { loadStatus } } } }")
                if all(e["loadStatus"] == "LOADED" for e in status["workspaceOrError"]["locationEntries"]):
                    break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "dagster_dev.log").read_text()[-3000:]
            assert time.time() < deadline, "dagster dev did not come up in 240 s"
            time.sleep(2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)   # the launcher SIGKILLs what has not stopped after its grace
        proc.wait(timeout=120)
        log.close()


def _shots_dir() -> Path:
    d = Path(os.environ.get("GOBLIN_SCREENSHOTS") or Path(os.environ["GOBLIN_HOME"]) / "screenshots")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _wait_for_run(url: str, timeout_s: float = 900) -> dict:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        runs = _graphql(url, "{ runsOrError { ... on Runs { results { runId jobName status tags { key value } } } } }")
        results = runs["runsOrError"]["results"]
        mine = [r for r in results if {"key": "dagster/partition", "value": "digits_mlp"} in r["tags"]]
        if mine and mine[0]["status"] in ("SUCCESS", "FAILURE", "CANCELED"):
            return mine[0]
        time.sleep(2)
    raise AssertionError("the run launched from the UI did not finish in time")


def _audit_stages() -> int:
    """How many assets the ``audit_workload`` job materializes: the audit's partitioned stages."""
    from goblin_assets.defs.audit import AUDIT_STAGES

    return sum(len(a.keys) for a in AUDIT_STAGES)


def _wait_for_kb(url: str, timeout_s: float = 600) -> None:
    """Wait until kb_index is materialized: the daemon builds the knowledge base on a fresh instance's first tick."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        nodes = _graphql(url, '{ assetNodes(assetKeys: [{path: ["kb_index"]}]) '
                              '{ assetMaterializations(limit: 1) { runId } } }')["assetNodes"]
        if nodes and nodes[0]["assetMaterializations"]:
            return
        time.sleep(3)
    raise AssertionError("the daemon did not build the knowledge base (kb_rules, kb_index) in time")


def _open_launch_dialog(page):
    """Click the job's "Materialize all…" until its launch dialog shows (a click while the page still loads the
    job's graph does nothing)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    dialog = page.locator(".dagster-dialog")
    for _ in range(6):
        page.locator("button", has_text="Materialize all").first.click()
        try:
            dialog.wait_for(timeout=15_000)
            return dialog
        except PlaywrightTimeout:
            pass
    raise AssertionError("the audit_workload job's launch dialog did not open")


def test_materialize_digits_audit_through_the_ui(dagster_ui):
    from playwright.sync_api import sync_playwright

    shots = _shots_dir()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(90_000)
        page.goto(f"{dagster_ui}/asset-groups", wait_until="networkidle")
        page.locator("button", has_text="Materialize all").first.wait_for()
        page.wait_for_timeout(1000)
        if page.get_by_role("button", name="Skip").count():  # first-visit community dialog
            page.get_by_role("button", name="Skip").click()
        page.screenshot(path=str(shots / "01_asset_graph.png"))
        for group in ("configs", "profiling", "kb", "benchmarks", "reports"):
            assert page.get_by_text(group, exact=True).count() > 0
        # README's way to audit a workload: the audit_workload job, one partition, Launch
        page.goto(f"{dagster_ui}/jobs", wait_until="networkidle")
        job = page.get_by_role("link", name="audit_workload").first
        job.wait_for()
        assert job.is_visible()
        job.click()
        page.get_by_text("Audit one workload: pick its partition").first.wait_for()
        page.wait_for_load_state("networkidle")
        page.wait_for_timeout(1000)
        page.screenshot(path=str(shots / "02_audit_workload_job.png"))
        _wait_for_kb(dagster_ui)
        dialog = _open_launch_dialog(page)
        dialog.get_by_text(f"Launch runs to materialize {_audit_stages()} assets").wait_for()
        dialog.get_by_text("Select a partition or create one").click()
        page.get_by_text("digits_mlp", exact=True).first.click()
        page.keyboard.press("Escape")
        page.wait_for_timeout(500)
        page.screenshot(path=str(shots / "03_launch_dialog.png"))
        page.get_by_role("button", name="Launch 1 run").click()
        run = _wait_for_run(dagster_ui)
        page.goto(f"{dagster_ui}/runs/{run['runId']}", wait_until="networkidle")
        page.wait_for_timeout(1000)
        page.screenshot(path=str(shots / "04_run.png"))
        assert run["status"] == "SUCCESS", f"run {run['runId']} ended {run['status']}"
        assert run["jobName"] == "audit_workload"
        # the asset checks: the waste budget's schema and sum checks, evaluated by the run, on its checks tab
        page.goto(f"{dagster_ui}/assets/waste_budget?view=checks&partition=digits_mlp", wait_until="networkidle")
        page.get_by_text("Evaluation result").first.wait_for()
        page.wait_for_timeout(1000)
        page.screenshot(path=str(shots / "05_waste_budget_checks.png"))
        body = page.inner_text("body")
        assert "Checks (2)" in body and "This is a blocking asset check." in body, body[:2000]
        for check in ("waste_budget_schema", "waste_budget_sums_to_step_time"):  # the list truncates long names
            assert check in body, body[:2000]
        assert body.count("Succeeded") >= 2 and "Passed" in body, body[:2000]
        # the audit report's metadata: the markdown report with the measured speedup and the diff
        page.goto(f"{dagster_ui}/assets/audit_report?view=events&partition=digits_mlp", wait_until="networkidle")
        page.get_by_text("Show Markdown").first.wait_for()
        page.screenshot(path=str(shots / "06_audit_report_events.png"))
        page.get_by_text("Show Markdown").first.click()  # the "report" entry: the rendered markdown report
        page.get_by_text("Measured speedup").first.wait_for()
        page.wait_for_timeout(1000)
        page.screenshot(path=str(shots / "07_audit_report_markdown.png"))
        body = page.inner_text("body")
        assert "Measured speedup" in body
        assert "data.loader_workers_with_threads" in body
        browser.close()
