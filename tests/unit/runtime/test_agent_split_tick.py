"""Agent.begin_tick/end_tick with snapshot/restore between them equals one Agent.tick."""

from __future__ import annotations

import itertools

import numpy as np

from scheduler_core.agent import Agent
from scheduler_core.messages import (
    AddTableRequest,
    Barrier,
    DispatchTableRequest,
    Header,
    Heartbeat,
    RemoveTableRequest,
)
from scheduler_core.model import Checkpoint
from scheduler_core.sim.fake_executor import FakeDownstream, FakeExecutor, FakeUpstream


def _world(split: bool) -> list:
    up, down = FakeUpstream(100), FakeDownstream(100)
    ex = FakeExecutor("c", down, up)
    ids = itertools.count()
    agent = Agent("c", ex, lambda: f"e{next(ids)}")
    out = []
    for step in range(6):
        up.advance(100 + 10 * (step + 1))
        h = Header(1, agent.epoch, 1, seq=step)
        msgs: list = [Heartbeat(h, "o", "c", np.array([1, 2]), False, Barrier(10_000))]
        if step == 1:
            reqs = (AddTableRequest("c", 1, False, Checkpoint.at(100)),)
            msgs.append(DispatchTableRequest(h, "o", "c", reqs))
        if step == 3:
            msgs.append(DispatchTableRequest(h, "o", "c", (RemoveTableRequest("c", 1),)))
        agent.handle(msgs)
        if not split:
            out.append(agent.tick())
            continue
        agent.begin_tick()
        ex.advance()
        state = agent.snapshot()
        fresh = Agent("c", ex, lambda: f"x{next(ids)}")
        fresh.restore(state)
        agent = fresh
        out.append(agent.end_tick())
        agent.restore(agent.snapshot())
    return out


def test_split_tick_with_restore_between_halves_equals_tick() -> None:
    whole, split = _world(False), _world(True)
    assert [[type(m) for m in t] for t in whole] == [[type(m) for m in t] for t in split]
    for a, b in zip(whole, split, strict=True):
        for ma, mb in zip(a, b, strict=True):
            assert ma.header.seq == mb.header.seq
            assert getattr(ma, "tables", None) == getattr(mb, "tables", None)
            assert getattr(ma, "statuses", None) == getattr(mb, "statuses", None)
