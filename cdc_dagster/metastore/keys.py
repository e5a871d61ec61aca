"""The etcd key layout: every key the metastore reads or writes, under one cluster prefix.

::

    {root}/{cluster}/owner                          election key (value: owner id; owner's lease)
    {root}/{cluster}/capture/{capture_id}           capture registry (JSON; capture's lease)
    {root}/{cluster}/desired/capture/{capture_id}   a capture the user asked for (JSON {ttl_s});
                                                    the owner registers it again if its lease
                                                    expired, until it is removed
    {root}/{cluster}/changefeed/info/{cf}           changefeed config (JSON)
    {root}/{cluster}/changefeed/status/{cf}         checkpoint, resolved, state, error (JSON)
    {root}/{cluster}/task/{cf}/{capture_id}         one capture's table statuses (binary; its lease)
    {root}/{cluster}/ddl/{cf}                       DDL and barrier state (JSON; owner-written)
    {root}/{cluster}/gc/safepoint                   min checkpoint over changefeeds (decimal TS)
    {root}/{cluster}/mailbox/{capture_id}           owner messages waiting for a capture's next
                                                    run (JSON; metastore/mailbox.py)
    {root}/{cluster}/agent/{cf}/{capture_id}        a capture's Agent state (JSON; its lease)
    {root}/{cluster}/admin/{cf}/{request_id}        an admin request the owner applies (JSON)
    {root}/{cluster}/applied/{cf}/ddl-{ts}-{digest} a DDL ran downstream (marker)
    {root}/{cluster}/applied/{cf}/syncpoint-{ts}    a syncpoint was recorded (marker)
    {root}/{cluster}/resnapshot/{cf}/{digest}       a table to snapshot again (JSON {database,
                                                    table}; ``table resnapshot``), until the
                                                    changefeed's puller run takes it
    {root}/{cluster}/problem/{cf}/{source}          what keeps a changefeed from moving, as a
                                                    capture, the puller or a DDL run saw it
                                                    (JSON; metastore/problems.py)

The owner reads O(captures) keys per tick: one range over ``task/{cf}/`` per changefeed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cdc_dagster.metastore.errors import InvalidArgumentError, InvalidKeySegmentError

DEFAULT_ROOT = "/cdc-dagster"
DEFAULT_CLUSTER = "default"

# Ids become one path segment: no "/", nothing that would need escaping.
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")  # fullmatch: "$" allows "\n"


def check_segment(kind: str, value: str) -> str:
    """Return ``value`` if it can be one key segment, else InvalidKeySegmentError saying why."""
    if not isinstance(value, str) or not _SEGMENT.fullmatch(value):
        raise InvalidKeySegmentError(
            f"{kind} {value!r} cannot be an etcd key segment: use 1-128 characters from "
            "[A-Za-z0-9._:@-], starting with a letter or digit"
        )
    return value


def prefix_end(prefix: str) -> str:
    """The smallest key greater than every key that starts with ``prefix`` (etcd range end)."""
    raw = bytearray(prefix.encode())
    # Keys here are ASCII, so the last byte is < 0xff.
    raw[-1] += 1
    return raw.decode()


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """Key names for one cdc-dagster cluster; several clusters can share one etcd."""

    cluster_id: str = DEFAULT_CLUSTER
    root: str = DEFAULT_ROOT

    def __post_init__(self) -> None:
        check_segment("cluster_id", self.cluster_id)
        if not self.root.startswith("/") or self.root.endswith("/") or "//" in self.root:
            raise InvalidArgumentError(
                f"root {self.root!r} must start with '/', not end with '/' and have no empty "
                "segment, e.g. '/cdc-dagster'"
            )

    @property
    def prefix(self) -> str:
        """Every key of this cluster starts with this (ends with '/')."""
        return f"{self.root}/{self.cluster_id}/"

    @property
    def owner(self) -> str:
        """The election key: exists while an owner holds its lease."""
        return self.prefix + "owner"

    @property
    def captures(self) -> str:
        """Prefix of the capture registry."""
        return self.prefix + "capture/"

    def capture(self, capture_id: str) -> str:
        """A capture's registry key."""
        return self.captures + check_segment("capture_id", capture_id)

    @property
    def changefeed_infos(self) -> str:
        """Prefix of every changefeed's config."""
        return self.prefix + "changefeed/info/"

    @property
    def changefeed_statuses(self) -> str:
        """Prefix of every changefeed's status."""
        return self.prefix + "changefeed/status/"

    def changefeed_info(self, changefeed_id: str) -> str:
        """A changefeed's config key."""
        return self.changefeed_infos + check_segment("changefeed_id", changefeed_id)

    def changefeed_status(self, changefeed_id: str) -> str:
        """A changefeed's status key."""
        return self.changefeed_statuses + check_segment("changefeed_id", changefeed_id)

    def tasks(self, changefeed_id: str) -> str:
        """Prefix of the per-capture table statuses of one changefeed."""
        return f"{self.prefix}task/{check_segment('changefeed_id', changefeed_id)}/"

    def task(self, changefeed_id: str, capture_id: str) -> str:
        """One capture's table statuses for one changefeed."""
        return self.tasks(changefeed_id) + check_segment("capture_id", capture_id)

    @property
    def all_tasks(self) -> str:
        """Prefix of every per-capture table status of every changefeed."""
        return self.prefix + "task/"

    @property
    def ddls(self) -> str:
        """Prefix of every changefeed's DDL and barrier state."""
        return self.prefix + "ddl/"

    def ddl(self, changefeed_id: str) -> str:
        """A changefeed's DDL and barrier state."""
        return self.ddls + check_segment("changefeed_id", changefeed_id)

    @property
    def gc_safepoint(self) -> str:
        """The GC safepoint: nothing below it may be collected from the change log."""
        return self.prefix + "gc/safepoint"

    @property
    def desired_captures(self) -> str:
        """Prefix of the captures the user asked for (desired state)."""
        return self.prefix + "desired/capture/"

    def desired_capture(self, capture_id: str) -> str:
        """One capture the user asked for."""
        return self.desired_captures + check_segment("capture_id", capture_id)

    @property
    def mailboxes(self) -> str:
        """Prefix of every capture's mailbox."""
        return self.prefix + "mailbox/"

    def mailbox(self, capture_id: str) -> str:
        """The owner messages waiting for ``capture_id``'s next run."""
        return self.mailboxes + check_segment("capture_id", capture_id)

    def agent_states(self, changefeed_id: str) -> str:
        """Prefix of every capture's Agent state for one changefeed."""
        return f"{self.prefix}agent/{check_segment('changefeed_id', changefeed_id)}/"

    def agent_state(self, changefeed_id: str, capture_id: str) -> str:
        """A capture's Agent state for one changefeed (under the capture's lease)."""
        return self.agent_states(changefeed_id) + check_segment("capture_id", capture_id)

    def admin_requests(self, changefeed_id: str | None = None) -> str:
        """Prefix of the pending admin requests (of one changefeed, or of all)."""
        base = self.prefix + "admin/"
        return (
            base
            if changefeed_id is None
            else base + check_segment("changefeed_id", changefeed_id) + "/"
        )

    def admin_request(self, changefeed_id: str, request_id: str) -> str:
        """One admin request of a changefeed."""
        return self.admin_requests(changefeed_id) + check_segment("request_id", request_id)

    def applied(self, changefeed_id: str) -> str:
        """Prefix of the markers of a changefeed's DDLs and syncpoints done downstream."""
        return f"{self.prefix}applied/{check_segment('changefeed_id', changefeed_id)}/"

    def ddl_applied(self, changefeed_id: str, commit_ts: int, digest: str) -> str:
        """The marker that says a DDL (by commit ts and query digest) ran downstream."""
        return f"{self.applied(changefeed_id)}ddl-{commit_ts:020d}-{digest}"

    def syncpoint_recorded(self, changefeed_id: str, ts: int) -> str:
        """The marker that says a syncpoint was recorded downstream."""
        return f"{self.applied(changefeed_id)}syncpoint-{ts:020d}"

    def resnapshot_requests(self, changefeed_id: str) -> str:
        """Prefix of a changefeed's re-snapshot requests (``table resnapshot``)."""
        return f"{self.prefix}resnapshot/{check_segment('changefeed_id', changefeed_id)}/"

    def resnapshot_request(self, changefeed_id: str, digest: str) -> str:
        """One table's re-snapshot request (``digest``: of its ``database.table``, which
        need not be a valid key segment)."""
        return self.resnapshot_requests(changefeed_id) + check_segment("digest", digest)

    def problems(self, changefeed_id: str | None = None) -> str:
        """Prefix of the problems (of one changefeed, or of all)."""
        base = self.prefix + "problem/"
        if changefeed_id is None:
            return base
        return base + check_segment("changefeed_id", changefeed_id) + "/"

    def problem(self, changefeed_id: str, source: str) -> str:
        """One source's problem with a changefeed (a capture id, ``puller`` or ``ddl``)."""
        return self.problems(changefeed_id) + check_segment("source", source)

    def last_segment(self, key: str) -> str:
        """The id at the end of ``key`` (capture id, changefeed id)."""
        return key.rsplit("/", 1)[1]
