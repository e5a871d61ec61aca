"""A driver in its own process (a new owner process): tick until caught up at a ts, or forever.

argv: endpoints cluster_id state_dir changelog_root sink_uri owner_id upto_ts max_ticks
Prints one JSON line per tick: {"tick": n, "owner_rev": r, "is_owner": b, "checkpoint": ts}.
"""

from __future__ import annotations

import json
import sys

from cdc_dagster.metastore import connect
from cdc_dagster.testing.driver import Driver

endpoints, cluster_id, state_dir, root, sink_uri, owner_id, upto, max_ticks = sys.argv[1:9]
ms = connect(endpoints.split(","), cluster_id=cluster_id, retry_timeout_s=10.0)
driver = Driver(state_dir, root, sink_uri, 2, metastore=ms, owner_id=owner_id, owner_lease_ttl_s=2)
for n in range(1, int(max_ticks) + 1):
    t = driver.tick()
    cf = t.owner.changefeeds.get("cf")
    line = {"tick": n, "owner_rev": t.owner.owner_rev, "is_owner": t.owner.is_owner}
    line |= {"checkpoint": cf.checkpoint_ts if cf else 0, "rebuilt": bool(cf and cf.rebuilt)}
    print(json.dumps(line), flush=True)
    if driver.caught_up(t, int(upto)):
        break
