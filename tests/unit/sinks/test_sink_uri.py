"""Sink URIs: the schemes a sink implements, and one clear error per bad URI."""

from __future__ import annotations

import pytest

import cdc_dagster.testing.fake_runtime  # noqa: F401  (registers the fake downstream's file://)
from cdc_dagster.sinks.delta import DeltaSink
from cdc_dagster.sinks.uri import (
    MAX_SINK_URI_CHARS,
    InvalidSinkUriError,
    UnknownSinkSchemeError,
    delta_root,
    delta_uri,
    open_sink,
    validate_sink_uri,
)


@pytest.mark.parametrize(
    "uri",
    [
        "delta:///data/lake",
        "delta:///data/lake?compression=snappy",
        "delta:///data/lake?compression=UNCOMPRESSED",
        "delta:///data/lake?vacuum_retention_hours=168&compression=lz4",
        "delta:///data/lake?vacuum_retention_hours=off",
        "delta:///data/lake?syncpoint_retention_hours=168&vacuum_retention_hours=0",
        "delta:///data/lake?syncpoint_retention_hours=Off",
        "file:///tmp/out",
        "postgres://u:p@db:5432/wh",
        "postgresql://db/wh",
    ],
)
def test_supported_sink_uris_pass(uri: str) -> None:
    assert validate_sink_uri(uri) == uri


@pytest.mark.parametrize(
    ("uri", "error", "says"),
    [
        ("kafka://b:9092/t", UnknownSinkSchemeError, "scheme 'kafka'"),
        ("/data/lake", UnknownSinkSchemeError, "no scheme"),
        ("", InvalidSinkUriError, "empty"),
        ("delta://", InvalidSinkUriError, "no directory"),
        ("delta://relative/lake", InvalidSinkUriError, "no directory"),
        ("delta:///data/lake?compression=brotli", InvalidSinkUriError, "not one of zstd"),
        ("delta:///data/lake?compression=", InvalidSinkUriError, "not one of zstd"),
        ("delta:///data/lake?codec=zstd", InvalidSinkUriError, r"unknown option\(s\) \['codec'\]"),
        ("delta:///data/lake?vacuum_retention_hours=-1", InvalidSinkUriError, "whole number"),
        ("delta:///data/lake?vacuum_retention_hours=1.5", InvalidSinkUriError, "whole number"),
        ("delta:///data/lake?vacuum_retention_hours=", InvalidSinkUriError, "whole number"),
        (
            "delta:///data/lake?syncpoint_retention_hours=1d",
            InvalidSinkUriError,
            "syncpoint_retention_hours='1d' is not a whole number of hours",
        ),
        (
            "delta:///data/lake?vacuum_retention_hours=1&vacuum_retention_hours=2",
            InvalidSinkUriError,
            "given 2 times",
        ),
        ("blackhole://", UnknownSinkSchemeError, "scheme 'blackhole'"),
        ("postgres:///wh", InvalidSinkUriError, "no host"),
        ("postgres://db:5432", InvalidSinkUriError, "no database"),
        ("postgres://db:99999/wh", InvalidSinkUriError, "bad port"),
    ],
)
def test_bad_sink_uris_get_their_own_error_naming_the_problem(uri, error, says) -> None:
    with pytest.raises(error, match=says) as raised:
        validate_sink_uri(uri)
    assert type(raised.value) is error


def test_an_overlong_sink_uri_is_refused() -> None:
    with pytest.raises(InvalidSinkUriError, match=f"at most {MAX_SINK_URI_CHARS}"):
        validate_sink_uri("delta:///" + "a" * MAX_SINK_URI_CHARS)


def test_a_literal_password_is_not_in_validation_errors() -> None:
    with pytest.raises(InvalidSinkUriError) as raised:
        validate_sink_uri("postgres://etl:hunter2@db:99999/wh")
    assert "hunter2" not in str(raised.value)


def test_a_delta_uri_opens_the_delta_sink_at_its_unquoted_root() -> None:
    assert open_sink("delta:///tmp/x%20y") == DeltaSink("/tmp/x y")
    assert delta_root(delta_uri("/tmp/x y")) == "/tmp/x y"


def test_every_known_scheme_that_validates_also_opens(tmp_path) -> None:
    for uri in (f"delta://{tmp_path}/lake", f"file://{tmp_path}/fake"):
        assert open_sink(validate_sink_uri(uri)) is not None
