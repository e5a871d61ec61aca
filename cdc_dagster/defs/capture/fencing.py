"""The receive step's checks, apart from Dagster: is this run's owner still the owner?"""

from __future__ import annotations

from dataclasses import dataclass


class StaleRunError(Exception):
    """The run was requested by an owner that has since been replaced; nothing is done."""


@dataclass(frozen=True, slots=True)
class Received:
    """What receive hands to prepare."""

    capture_id: str
    owner_rev: int
    tick: int
    lease_ttl_s: int
    messages: dict  # changefeed id -> wire messages


def check_owner_rev(capture_id: str, run_owner_rev: int, current_owner_rev: int | None) -> None:
    """Refuse a run whose owner_rev is below the registry's current owner's."""
    if current_owner_rev is not None and run_owner_rev < current_owner_rev:
        raise StaleRunError(
            f"capture {capture_id}: run requested by owner_rev {run_owner_rev}, but owner_rev "
            f"{current_owner_rev} owns the cluster now; this run does nothing (the new owner "
            "sends its own)"
        )
