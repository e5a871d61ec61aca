"""Headless Chromium over the Dagster UI: the lineage of a model reaches replica and upstream.

The webserver loads the production code location (``cdc_dagster.defs``, as workspace.yaml
does) over a change log holding the dbt sources' tables.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
REPO = Path(__file__).resolve().parents[3]
ARTEFACTS = Path(os.environ.get("CDC_DAGSTER_TEST_ARTEFACTS", REPO / "test-artefacts"))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_webserver(workdir: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    home = Path(workdir, "dagster_home")
    home.mkdir()
    from tests.integration.dbt_build.replica import TABLES
    from tests.unit.defs.conftest import write_changelog

    changelog = write_changelog(
        Path(workdir, "changelog"), [(t.table_id, t.database, t.table) for t in TABLES]
    )
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "PYTHONPATH": str(REPO),
        "CDC_DAGSTER_CHANGELOG": str(changelog),
        "CDC_DAGSTER_STATE_DIR": workdir,
        "DAGSTER_DISABLE_TELEMETRY": "1",
    }
    log = open(os.path.join(workdir, "webserver.log"), "wb")  # noqa: SIM115 (outlives the call)
    argv = [
        str(Path(sys.executable).parent / "dagster-webserver"),
        "-m",
        "cdc_dagster.defs",
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            urllib.request.urlopen(f"{url}/server_info", timeout=2).read()
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(Path(workdir, "webserver.log").read_text()[-3000:]) from None
            time.sleep(1)


def _dismiss_welcome(page) -> None:
    """Close the first-visit dialog; it only sometimes shows."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.get_by_role("button", name="Skip").click(timeout=5000)
    except PlaywrightTimeout:
        return


def test_lineage_view_shows_model_replica_and_upstream(workdir: str) -> None:
    from playwright.sync_api import sync_playwright

    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    proc, url = _start_webserver(workdir)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(
                f"{url}/assets/dbt/order_facts?view=lineage&lineageScope=upstream&lineageDepth=5",
                wait_until="networkidle",
            )
            _dismiss_welcome(page)
            page.get_by_text("stg_orders").first.wait_for(timeout=90_000)
            page.get_by_text("customers").first.wait_for(timeout=30_000)
            page.wait_for_timeout(1500)
            text = page.inner_text("body")
            page.screenshot(path=str(ARTEFACTS / "dbt_lineage.png"), full_page=True)
            browser.close()
        for node in ("order_facts", "stg_orders", "stg_customers", "orders", "customers"):
            assert node in text, f"{node} missing from the lineage view"
        assert "replica" in text and "upstream" in text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
