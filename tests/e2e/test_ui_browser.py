"""Headless Chromium over the Dagster UI: a replicated table's page, its lag plot, the lineage.

Progress is reported as the capture's report op reports it (asset materializations with
the same metadata), so the pages show what a running changefeed shows. Screenshots are
saved under the test artefacts dir.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import dagster as dg
import pytest

from cdc_dagster.defs.catalog import demo_catalog
from cdc_dagster.defs.tables.assets import materializations
from cdc_dagster.runtime import TableProgress
from cdc_dagster.services.dagster_home import dagster_home
from scheduler_core.ts import compose
from tests.unit.defs.conftest import TABLES, write_changelog

from .conftest import start_webserver

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

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium")


def _report_progress(state_dir: Path, points: int = 8) -> None:
    os.environ["DAGSTER_HOME"] = str(dagster_home(state_dir))
    catalog = demo_catalog(TABLES)
    now_ms = time.time_ns() // 1_000_000
    with dg.DagsterInstance.get() as instance:
        for i in range(points):
            ckpt = compose(now_ms - (points - i) * 5000 - (i % 3) * 1500)
            reports = [
                TableProgress(
                    "demo",
                    tid,
                    "replicating",
                    "capture-1",
                    ckpt,
                    ckpt + 10,
                    ckpt + 20,
                    10 * i + tid,
                )
                for tid, _, _ in TABLES
            ]
            for event in materializations(catalog, reports, now_ms - (points - i) * 5000):
                instance.report_runless_asset_event(event)


def _dismiss_welcome(page: object) -> None:
    """Close the first-visit "Join the Dagster community" dialog if it shows."""
    skip = page.get_by_role("button", name="Skip")  # type: ignore[attr-defined]
    try:
        skip.click(timeout=5000)
    except Exception:
        return


def test_replica_page_lag_plot_and_lineage(
    tmp_path: Path, artefacts: Path, stop_later: list[int]
) -> None:
    from playwright.sync_api import sync_playwright

    state_dir = tmp_path / "state"
    changelog = write_changelog(tmp_path / "changelog")
    _report_progress(state_dir)
    url, pid = start_webserver(state_dir, {"CDC_DAGSTER_CHANGELOG": str(changelog)})
    stop_later.append(pid)
    asset = f"{url}/assets/replica/bank/accounts_0"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.goto(asset, wait_until="networkidle")
        _dismiss_welcome(page)
        page.get_by_text("checkpoint_ts_raw").first.wait_for(timeout=60_000)
        body = page.inner_text("body")
        assert "lag_seconds" in body and "capture-1" in body and "barrier_ts" in body
        page.screenshot(path=str(artefacts / "replica_table.png"), full_page=True)

        page.get_by_role("button", name="Plots").first.click()
        page.locator("canvas").first.wait_for(timeout=60_000)
        page.get_by_text("lag_seconds").first.scroll_into_view_if_needed()
        page.wait_for_timeout(1500)
        assert "lag_seconds" in page.inner_text("body")
        page.screenshot(path=str(artefacts / "replica_lag_plot.png"), full_page=True)

        page.goto(f"{asset}?view=lineage", wait_until="networkidle")
        page.get_by_text("accounts_0").first.wait_for(timeout=60_000)
        page.get_by_text("Loading...").first.wait_for(state="detached", timeout=30_000)
        text = page.inner_text("body")
        assert "upstream" in text.lower() or "accounts_0" in text
        page.screenshot(path=str(artefacts / "replica_lineage.png"), full_page=True)

        page.goto(f"{url}/jobs", wait_until="networkidle")
        page.get_by_text("move_table").first.wait_for(timeout=60_000)
        assert "drain_capture" in page.inner_text("body")
        page.screenshot(path=str(artefacts / "admin_jobs.png"), full_page=True)
        browser.close()
