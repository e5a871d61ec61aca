"""A candidate owner in its own process, driven by line commands on stdin (for the tests).

Usage: ``python owner_proc.py ENDPOINTS CLUSTER_ID OWNER_ID TTL_S``. Commands, one per
line: ``campaign TIMEOUT_S``, ``write KEY_SUFFIX``, ``is_owner``, ``exit``. Each answer
is one JSON line on stdout.
"""

from __future__ import annotations

import json
import sys

from cdc_dagster.metastore import NotOwnerError, OwnerSession, connect
from cdc_dagster.metastore.errors import CampaignTimeoutError


def _say(**event: object) -> None:
    print(json.dumps(event), flush=True)


def main(endpoints: str, cluster_id: str, owner_id: str, ttl_s: int) -> None:
    ms = connect(endpoints, cluster_id=cluster_id, retry_timeout_s=10.0)
    session: OwnerSession | None = None
    _say(event="ready")
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "campaign":
            try:
                session = ms.election.campaign(owner_id, ttl_s, timeout_s=float(args[0]))
                _say(event="owner", owner_rev=session.owner_rev)
            except CampaignTimeoutError:
                _say(event="campaign_timeout")
        elif cmd == "write":
            assert session is not None, "write before campaign"
            try:
                rev = session.put(ms.layout.prefix + "data/" + args[0], owner_id.encode())
                _say(event="write", ok=True, revision=rev)
            except NotOwnerError as exc:
                _say(event="write", ok=False, current_rev=exc.current_rev, error=str(exc))
        elif cmd == "is_owner":
            _say(event="is_owner", value=session is not None and session.is_owner())
        elif cmd == "exit":
            break
    ms.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
