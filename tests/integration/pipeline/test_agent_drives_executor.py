"""The scheduler's Agent driving SparkTableExecutor: add (prepare + commit), replicate, remove."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scenario import Workload, ts
from test_executor import assert_replicated, make

from scheduler_core.agent import Agent
from scheduler_core.executor import TableExecutor
from scheduler_core.messages import (
    AddTableRequest,
    Barrier,
    DispatchTableRequest,
    Header,
    Heartbeat,
    RemoveTableRequest,
)
from scheduler_core.model import Checkpoint, TableState

CAP, OWNER = "c1", "owner"


@pytest.mark.slow
def test_agent_adds_replicates_and_removes_tables_on_spark(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1, 2])
    w.write(steps=2)
    ex = make(tmp_path, spark)
    assert isinstance(ex, TableExecutor)
    counter = itertools.count(1)
    agent = Agent(CAP, ex, lambda: f"e{next(counter)}")

    def heartbeat() -> Heartbeat:
        return Heartbeat(Header(1, "", 1), OWNER, CAP, np.array([1, 2], np.int64), False, Barrier())

    agent.handle([heartbeat()])
    agent.tick()
    start = Checkpoint(ts(1), ts(1))
    adds = tuple(AddTableRequest(CAP, t, False, start) for t in (1, 2))
    agent.handle([DispatchTableRequest(Header(1, agent.epoch, 1), OWNER, CAP, adds), heartbeat()])
    agent.tick()  # prepare, pull (PREPARED), commit
    assert ex.status(1).state == TableState.REPLICATING
    top = w.write(steps=2)
    agent.handle([heartbeat()])
    agent.tick()  # pull + sink
    assert_replicated(tmp_path, w, top)
    remove = (RemoveTableRequest(CAP, 2),)
    agent.handle([DispatchTableRequest(Header(1, agent.epoch, 1), OWNER, CAP, remove)])
    out = agent.tick()  # STOPPING -> flushed -> STOPPED, reported once, then forgotten
    stopped = [s for m in out for s in getattr(m, "statuses", ())]
    assert [(s.table_id, s.state) for s in stopped] == [(2, TableState.STOPPED)]
    assert stopped[0].checkpoint.checkpoint_ts == top
    assert ex.status(2).state == TableState.ABSENT
