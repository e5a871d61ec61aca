"""The Agent's durable state survives encode/decode exactly (tasks, heartbeat, half tick)."""

from __future__ import annotations

import numpy as np

from cdc_dagster.runtime.capture import decode_agent_state, encode_agent_state
from scheduler_core.agent import AgentState
from scheduler_core.messages import (
    AddTableRequest,
    Barrier,
    Header,
    Heartbeat,
    RemoveTableRequest,
)
from scheduler_core.model import Checkpoint


def test_agent_state_round_trip() -> None:
    hb = Heartbeat(Header(4, "r.4", 2, 9), "owner", "cap", np.array([1, 2]), False, Barrier(50))
    state = AgentState(
        owner_rev=4,
        owner_id="owner",
        epoch="r.4",
        changefeed_epoch=2,
        stopping=True,
        seq=17,
        tasks=(
            (AddTableRequest("cap", 1, False, Checkpoint(5, 6)), True),
            (RemoveTableRequest("cap", 2), False),
        ),
        heartbeat=None,
        half_heartbeat=hb,
        half_finished=(3,),
        in_tick=True,
    )
    back = decode_agent_state(encode_agent_state(state), "cap")
    assert back is not None
    assert back.tasks == state.tasks
    assert back.half_heartbeat is not None and back.half_heartbeat.barrier == hb.barrier
    assert back.half_heartbeat.table_ids.tolist() == [1, 2]
    same = ("owner_rev", "owner_id", "epoch", "changefeed_epoch", "stopping", "seq")
    assert all(getattr(back, f) == getattr(state, f) for f in same)
    assert (back.heartbeat, back.half_finished, back.in_tick) == (None, (3,), True)


def test_agent_state_of_another_version_is_ignored() -> None:
    assert decode_agent_state(b'{"v": 99}', "cap") is None
