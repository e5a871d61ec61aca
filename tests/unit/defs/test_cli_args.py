"""CLI argument handling without any server."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_dagster.cli import build_parser
from cdc_dagster.cli_args import CliError, load_changefeed_config, parse_duration_s


@pytest.mark.parametrize(
    ("text", "seconds"), [(30, 30), ("30s", 30), ("10m", 600), ("1h30m", 5400)]
)
def test_durations(text: object, seconds: int) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("text", ["", "ten", "5x", True])
def test_bad_durations_are_refused(text: object) -> None:
    with pytest.raises(CliError):
        parse_duration_s(text)


def test_config_file_gives_filter_and_syncpoint(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('sync-point-interval = "1m"\n[filter]\nrules = ["a.*"]\n')
    assert load_changefeed_config(path) == {"table_filter": ("a.*",), "sync_point_interval_s": 60}


def test_disabled_syncpoint(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('enable-sync-point = false\nsync-point-interval = "1m"\n')
    assert load_changefeed_config(path) == {"sync_point_interval_s": 0}


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(CliError, match="cannot read config"):
        load_changefeed_config(tmp_path / "nope.toml")


def test_every_command_parses() -> None:
    p = build_parser()
    for argv in (
        ["changefeed", "create", "-c", "x", "--sink-uri", "delta:///a", "--start-ts", "5"],
        ["changefeed", "list"],
        ["capture", "add", "c1", "--ttl", "30"],
        ["table", "move", "-c", "x", "--table-id", "1", "--capture-id", "c1"],
        ["owner", "resign"],
        ["server", "status"],
        ["demo", "--tables", "3"],
    ):
        assert p.parse_args(argv).group == argv[0]


def test_missing_sink_uri_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["changefeed", "create", "-c", "x"])
    assert exc.value.code == 2


def test_a_config_that_is_not_utf8_text_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cf.toml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 64)
    with pytest.raises(CliError, match=rf"config {path} is not UTF-8 text \(byte 0 is 0x89\)"):
        load_changefeed_config(path)


def test_a_huge_config_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "big.toml"
    path.write_bytes(b"#" * (10 << 20))
    with pytest.raises(CliError, match=rf"config {path} is 10485760 bytes"):
        load_changefeed_config(path)
