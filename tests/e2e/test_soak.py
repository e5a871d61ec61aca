"""Soak mode (issue 17 item 6): random faults of the matrix against the workloads for
``CDC_DAGSTER_SOAK_MINUTES`` minutes, on the stack the fault matrix uses; then every table
is checked at the end. Skipped unless the variable is set (CI does not soak).

``CDC_DAGSTER_SOAK_SEED`` seeds the choice of faults, the quiet spells between them and
the MariaDB workload (default 17), so a soak can be replayed; ``CDC_DAGSTER_SOAK_FAULTS``
(comma-separated names of ``cdc_dagster.testing.faults.FAULTS``) narrows the faults drawn. The table (faults injected,
rows checked, violations, longest stall and its cause, then one line per fault) is printed
and written to ``test-artefacts/soak.txt``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdc_dagster.testing.faults import FAULTS, SOAK_ENV, SOAK_SEED_ENV, FaultStack, say, soak

MINUTES = float(os.environ.get(SOAK_ENV, "0") or 0)
SEED = int(os.environ.get(SOAK_SEED_ENV, "17") or 17)
RECOVER_S = 300.0
NAMES = [n.strip() for n in os.environ.get("CDC_DAGSTER_SOAK_FAULTS", "").split(",") if n.strip()]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(MINUTES <= 0, reason=f"set {SOAK_ENV}=N to soak for N minutes"),
]


# The soak itself, the stack's start and the end's catch-up, and one last fault's recovery.
@pytest.mark.timeout(int(MINUTES * 60 + 1800))
def test_soak_random_faults_heal_with_no_violation(
    tmp_path_factory: pytest.TempPathFactory, artefacts: Path
) -> None:
    unknown = sorted(set(NAMES) - set(FAULTS))
    assert not unknown, (
        f"CDC_DAGSTER_SOAK_FAULTS: unknown fault(s) {unknown}; known: {sorted(FAULTS)}"
    )
    state = tmp_path_factory.mktemp("soak") / "state"
    with FaultStack(state, mysql=True, seed=SEED) as fs:
        fs.wait_replicating()
        report = soak(fs, MINUTES, SEED, NAMES or None, recover_timeout_s=RECOVER_S)
    table = report.table()
    (artefacts / "soak.txt").write_text("\n".join(table) + "\n")
    for line in table:
        say(line)
    assert report.recoveries, "no fault was injected"
    assert report.violations == 0, report.failures
    assert not report.unrecovered, [r.line() for r in report.unrecovered]
    assert report.missing_captures == set(), "captures asked for but not registered at the end"
    assert report.rows_checked > 0
