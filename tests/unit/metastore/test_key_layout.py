"""The etcd key layout and endpoint parsing."""

from __future__ import annotations

import pytest

from cdc_dagster.metastore.client import parse_endpoints
from cdc_dagster.metastore.errors import InvalidEndpointError
from cdc_dagster.metastore.keys import KeyLayout, prefix_end


def test_every_key_sits_under_the_cluster_prefix_in_the_documented_place() -> None:
    keys = KeyLayout("prod", root="/cdc")
    assert keys.prefix == "/cdc/prod/"
    assert keys.owner == "/cdc/prod/owner"
    assert keys.capture("cap-1") == "/cdc/prod/capture/cap-1"
    assert keys.changefeed_info("orders") == "/cdc/prod/changefeed/info/orders"
    assert keys.changefeed_status("orders") == "/cdc/prod/changefeed/status/orders"
    assert keys.task("orders", "cap-1") == "/cdc/prod/task/orders/cap-1"
    assert keys.tasks("orders") == "/cdc/prod/task/orders/"
    assert keys.ddl("orders") == "/cdc/prod/ddl/orders"
    assert keys.gc_safepoint == "/cdc/prod/gc/safepoint"


def test_two_clusters_share_no_key_prefix() -> None:
    a, b = KeyLayout("a"), KeyLayout("ab")
    assert not b.prefix.startswith(a.prefix)


def test_task_keys_of_one_changefeed_do_not_cover_a_changefeed_whose_id_extends_it() -> None:
    keys = KeyLayout()
    assert not keys.task("orders-2", "cap").startswith(keys.tasks("orders"))


@pytest.mark.parametrize("bad", ["", "a/b", "-lead", "sp ace", "x" * 129])
def test_ids_that_cannot_be_one_key_segment_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="key segment"):
        KeyLayout().capture(bad)


@pytest.mark.parametrize("root", ["cdc", "/cdc/", "/a//b"])
def test_malformed_roots_are_refused(root: str) -> None:
    with pytest.raises(ValueError, match="root"):
        KeyLayout(root=root)


def test_prefix_end_is_the_first_key_after_the_prefix_range() -> None:
    assert prefix_end("/a/b/") == "/a/b0"
    assert "/a/b/zzz" < prefix_end("/a/b/") <= "/a/b0"


@pytest.mark.parametrize(
    ("given", "parsed"),
    [
        ("127.0.0.1:2379", [("127.0.0.1", 2379)]),
        ("h1:2379, h2:2380", [("h1", 2379), ("h2", 2380)]),
        (["http://h1:2379/"], [("h1", 2379)]),
        ("[::1]:2379", [("::1", 2379)]),
    ],
)
def test_endpoints_parse_from_the_etcd_flag_forms(given, parsed) -> None:
    assert parse_endpoints(given) == parsed


@pytest.mark.parametrize("bad", ["", "hostonly", "h:notaport", "h:0", "https://h:2379"])
def test_bad_endpoints_are_refused_with_the_expected_form(bad: str) -> None:
    with pytest.raises(InvalidEndpointError):
        parse_endpoints(bad)
