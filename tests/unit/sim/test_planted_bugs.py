"""The soak must catch each planted bug: a validator that misses one checks bookkeeping.

Each test switches one known-wrong rule on (``scheduler_core.sim.planted``) and runs the
schedules of the profile that exercises it until a violation shows; the same schedules
pass without the plant (``test_soak_profiles.py``).
"""

from __future__ import annotations

import logging

import pytest

from scheduler_core.sim.planted import PLANTS
from scheduler_core.sim.simulator import run_schedule

MAX_SEEDS = 200

CATCHING_PROFILE = {
    "multi_table_drop_blocks_first_table_only": "ddl_heavy",
    "owner_accepts_stale_capture_epochs": "stale_reports",
    "new_primary_starts_at_its_prepare_checkpoint": "lossless_moves",
    "promote_while_undetermined": "slow_stop_owner_churn",
    "sink_spans_syncpoints": "syncpoints",
    "table_set_changes_before_syncpoint_record": "syncpoints",
    "open_barrier_ignores_stream_ddls": "open_barriers",
    "balance_waits_for_a_quiet_changefeed": "scale_out",
    "balance_ignores_capture_changes": "scale_out",
}


def first_violation(plant: str, profile: str, seeds: range) -> tuple[int, str] | None:
    logging.disable(logging.CRITICAL)
    try:
        with PLANTS[plant]():
            for seed in seeds:
                try:
                    run_schedule(seed, profile=profile)
                except AssertionError as err:  # InvariantViolation, ExecutorContractError
                    return seed, str(err)
    finally:
        logging.disable(logging.NOTSET)
    return None


@pytest.mark.parametrize("plant", sorted(CATCHING_PROFILE))
def test_soak_catches_planted_bug(plant: str) -> None:
    found = first_violation(plant, CATCHING_PROFILE[plant], range(MAX_SEEDS))
    assert found is not None, f"{MAX_SEEDS} schedules of {CATCHING_PROFILE[plant]} missed {plant}"


def test_plants_restore_what_they_patch() -> None:
    from scheduler_core.replication import ReplicationSet

    before = ReplicationSet.has_undetermined
    with PLANTS["promote_while_undetermined"]():
        assert ReplicationSet.has_undetermined is not before
    assert ReplicationSet.has_undetermined is before


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="redundant while sinks obey barriers: a table's checkpoint never passes its table "
    "barrier, so the min over tables is already capped; only a sink that overshoots could "
    "show it, and the order check flags that overshoot with or without the cap",
)
def test_soak_catches_cap_ignoring_table_barriers() -> None:
    for profile in ("ddl_heavy", "default"):
        found = first_violation("cap_ignores_table_barriers", profile, range(100))
        assert found is not None
