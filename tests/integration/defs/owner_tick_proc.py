"""One code server's owner loop in its own process, as the owner sensor builds it, driven by
line commands on stdin (for the tests).

Settings come from ``CDC_DAGSTER_*`` variables only, so a test that leaves
``CDC_DAGSTER_OWNER_ID`` unset gets the default owner identity. Commands, one per line:
``tick`` (one owner tick; answers ``{"is_owner", "owner_id", "current", "owner_rev"}``) and
``exit``. Each answer is one JSON line on stdout.
"""

from __future__ import annotations

import json
import sys

from cdc_dagster.defs.resources import CdcResource


def main() -> None:
    loop = CdcResource().owner_loop()
    print(json.dumps({"event": "ready", "owner_id": loop.owner_id}), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "tick":
            tick = loop.tick()
            answer = {
                "event": "tick",
                "is_owner": tick.is_owner,
                "owner_id": loop.owner_id,
                "current": tick.owner_id,
                "owner_rev": tick.owner_rev,
                "reason": tick.reason,
            }
            print(json.dumps(answer), flush=True)
        elif cmd == "exit":
            break


if __name__ == "__main__":
    main()
