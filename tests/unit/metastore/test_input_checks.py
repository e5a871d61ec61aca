"""Input the metastore refuses, each with a clear error of its own hierarchy."""

from __future__ import annotations

import time

import pytest

from cdc_dagster.metastore import errors as e
from cdc_dagster.metastore.changefeeds import ChangefeedInfo, decode_info
from cdc_dagster.metastore.client import Compare, CompareTarget, EtcdClient, KeyValue, TlsConfig
from cdc_dagster.metastore.election import Election
from cdc_dagster.metastore.etcd_process import free_ports
from cdc_dagster.metastore.keys import KeyLayout, check_segment
from cdc_dagster.metastore.validation import (
    MAX_FILTER_RULES,
    TableFilter,
    validate_changefeed_id,
    validate_start_ts,
    validate_sync_point_interval,
)
from scheduler_core.ts import compose

NOW_MS = 1_763_770_000_000
SECRET_URI = "postgres://etl:hunter2@db:5432/wh"


# --- a trailing newline is not part of an id --------------------------------------------


def test_changefeed_id_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(e.InvalidChangefeedIdError):
        validate_changefeed_id("orders\n")


def test_filter_rule_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(e.MalformedTableFilterError):
        TableFilter.parse(["shop.orders\n"])


def test_key_segment_with_a_trailing_newline_is_refused_in_the_hierarchy() -> None:
    with pytest.raises(e.InvalidKeySegmentError):
        check_segment("capture_id", "cap-1\n")
    with pytest.raises(e.InvalidKeySegmentError):
        KeyLayout("prod\n")


# --- a start ts that is clearly not a TS ------------------------------------------------


def test_a_millisecond_timestamp_is_refused_as_start_ts_showing_how_to_make_a_ts() -> None:
    with pytest.raises(e.InvalidTsError, match=rf"compose\({NOW_MS}\) = {compose(NOW_MS)}"):
        validate_start_ts(NOW_MS, gc_safepoint=0, now_ms=NOW_MS)


def test_a_real_ts_on_a_fresh_cluster_is_accepted() -> None:
    ts = compose(NOW_MS - 1000)
    assert validate_start_ts(ts, gc_safepoint=0, now_ms=NOW_MS) == ts


# --- bounded configs --------------------------------------------------------------------


def test_too_many_or_too_long_filter_rules_are_refused() -> None:
    with pytest.raises(e.MalformedTableFilterError, match="at most"):
        TableFilter.parse([f"s.t{i}" for i in range(MAX_FILTER_RULES + 1)])
    with pytest.raises(e.MalformedTableFilterError, match="at most"):
        TableFilter.parse(["s." + "t" * 300])


@pytest.mark.parametrize("interval", [-1, 86_401, 10**9, 1.5])
def test_syncpoint_interval_out_of_range_is_refused(interval: object) -> None:
    with pytest.raises(e.InvalidChangefeedOptionError, match=r"0 \(syncpoints off\) or"):
        validate_sync_point_interval(interval)  # type: ignore[arg-type]


@pytest.mark.parametrize("interval", [0, 1, 600, 86_400])
def test_syncpoint_interval_in_range_is_accepted(interval: int) -> None:
    assert validate_sync_point_interval(interval) == interval


# --- secrets never shown ----------------------------------------------------------------


def test_a_password_reference_is_valid_and_kept_as_written() -> None:
    uri = "postgres://etl:${PG_PASSWORD}@db:5432/wh"
    info = ChangefeedInfo("orders", uri, ("*.*",), compose(NOW_MS))
    assert info.sink_uri == uri


def test_a_literal_password_is_not_in_repr() -> None:
    info = ChangefeedInfo("orders", SECRET_URI, ("*.*",), compose(NOW_MS))
    assert "hunter2" not in repr(info)
    assert "etl:***@db" in repr(info)


def test_a_literal_password_is_not_in_a_corrupt_value_excerpt() -> None:
    value = b'{"v":1,"w":"x","changefeed_id":"orders","sink_uri":"' + SECRET_URI.encode() + b'"}'
    with pytest.raises(e.CorruptValueError) as raised:
        decode_info(KeyValue("/k", value, 1, 1, 1, 0))
    assert "hunter2" not in str(raised.value)


# --- leases, campaign, connection settings ----------------------------------------------


@pytest.mark.parametrize("ttl", [0, -1, 1.5])
def test_a_lease_ttl_below_one_second_is_refused_not_silently_raised(ttl: object) -> None:
    client = EtcdClient([f"127.0.0.1:{free_ports(1)[0]}"], retry_timeout_s=1)
    try:
        with pytest.raises(e.InvalidLeaseTtlError, match=">= 1"):
            client.grant_lease(ttl)  # type: ignore[arg-type]
    finally:
        client.close()


def test_campaign_timeout_is_honoured_while_etcd_is_down() -> None:
    client = EtcdClient([f"127.0.0.1:{free_ports(1)[0]}"], retry_timeout_s=15)
    try:
        began = time.monotonic()
        with pytest.raises(e.CampaignTimeoutError, match=r"within 1\.0s"):
            Election(client, KeyLayout()).campaign("owner", 5, timeout_s=1.0)
        assert time.monotonic() - began < 3.0
    finally:
        client.close()


def test_a_bad_compare_op_is_in_the_hierarchy() -> None:
    with pytest.raises(e.InvalidArgumentError):
        Compare("/k", CompareTarget.MOD, "=>", 1)


def test_user_without_password_is_refused() -> None:
    with pytest.raises(e.InvalidConnectionConfigError, match="both a user name and a password"):
        EtcdClient(["127.0.0.1:2379"], user="root")


def test_tls_config_checks_its_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(e.InvalidConnectionConfigError, match="cannot be read"):
        TlsConfig(ca_cert=str(tmp_path / "missing.pem"))
    not_pem = tmp_path / "ca.txt"
    not_pem.write_text("hello")
    with pytest.raises(e.InvalidConnectionConfigError, match="not a PEM"):
        TlsConfig(ca_cert=str(not_pem))
    pem = tmp_path / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(e.InvalidConnectionConfigError, match="both the client certificate"):
        TlsConfig(ca_cert=str(pem), cert_cert=str(pem))


def test_an_https_endpoint_without_tls_config_says_what_to_pass() -> None:
    with pytest.raises(e.InvalidEndpointError, match="CA certificate"):
        EtcdClient(["https://10.0.0.1:2379"])


def test_a_task_status_with_a_bad_field_raises_in_the_hierarchy() -> None:
    from cdc_dagster.metastore.status_codec import TaskStatus
    from scheduler_core.messages import Liveness, TableStatusBatch

    with pytest.raises(e.InvalidArgumentError, match="owner_rev"):
        TaskStatus(-1, 1, Liveness.ALIVE, TableStatusBatch([], [], [], []))
