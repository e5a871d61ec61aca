"""The CLI against a real etcd: each command's effect, and one-line errors that change nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from cdc_dagster.cli import main
from cdc_dagster.metastore import Metastore
from cdc_dagster.testing.servers import PrivatePostgres

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(etcd_endpoints: list[str], cluster_id: str, capsys: pytest.CaptureFixture[str]) -> Run:
    def run(*argv: str) -> tuple[int, str, str]:
        code = main(["--etcd", ",".join(etcd_endpoints), "--cluster-id", cluster_id, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_changefeed_lifecycle_create_list_query_pause_update_resume_remove(
    cli: Run, tmp_path: Path
) -> None:
    config = tmp_path / "cf.toml"
    config.write_text('sync-point-interval = "30s"\n[filter]\nrules = ["bank.*", "!bank.tmp"]\n')
    code, out, err = cli(
        "changefeed",
        "create",
        "-c",
        "cf-1",
        "--sink-uri",
        "delta:///tmp/lake",
        "--config",
        str(config),
    )
    assert (code, err) == (0, ""), err
    assert "created changefeed cf-1" in out
    code, out, _ = cli("changefeed", "list")
    assert [r["id"] for r in json.loads(out)] == ["cf-1"]
    code, out, _ = cli("changefeed", "query", "-c", "cf-1")
    row = json.loads(out)
    assert row["filter"] == ["bank.*", "!bank.tmp"] and row["sync_point_interval_s"] == 30
    assert (row["state"], row["error"]) == ("normal", "")
    # Each ts once, as a number and as UTC time, and the lag in seconds.
    assert isinstance(row["checkpoint_ts"], int) and row["checkpoint_time"].endswith("Z")
    assert isinstance(row["resolved_ts"], int) and row["resolved_time"].endswith("Z")
    assert isinstance(row["lag_s"], float) and row["lag_s"] >= 0
    assert cli("changefeed", "pause", "-c", "cf-1")[0] == 0
    assert cli("changefeed", "update", "-c", "cf-1", "--sink-uri", "delta:///tmp/lake2")[0] == 0
    assert (
        json.loads(cli("changefeed", "query", "-c", "cf-1")[1])["sink_uri"] == "delta:///tmp/lake2"
    )
    assert cli("changefeed", "resume", "-c", "cf-1")[0] == 0
    assert cli("changefeed", "remove", "-c", "cf-1")[0] == 0
    assert json.loads(cli("changefeed", "list")[1]) == []


def test_literal_password_is_never_printed(cli: Run, pg_server: PrivatePostgres) -> None:
    uri = pg_server.uri(password="hunter2")  # the private server trusts every password
    code, out, err = cli("changefeed", "create", "-c", "pg", "--sink-uri", uri)
    assert code == 0, err
    code, out, err = cli("changefeed", "query", "-c", "pg")
    assert "hunter2" not in out + err and "postgres:***@127.0.0.1" in out


def test_env_reference_in_uri_is_kept_visible(
    cli: Run, pg_server: PrivatePostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PG_PASSWORD", "s3cret")  # resolved where the sink is reached
    uri = pg_server.uri(password="${PG_PASSWORD}")
    assert cli("changefeed", "create", "-c", "pg2", "--sink-uri", uri)[0] == 0
    assert "${PG_PASSWORD}" in cli("changefeed", "query", "-c", "pg2")[1]


@pytest.mark.parametrize(
    ("sink", "says"),
    [
        ("delta://relative/lake", "no directory given as an absolute path"),
        ("delta:///proc/nope/lake", "cannot write in /proc"),
        ("postgresql://postgres@127.0.0.1:1/downstream", "cannot connect"),
        ("PG/nosuchdb", 'database "nosuchdb" does not exist'),
        ("PG-READER", "may not create schemas"),
    ],
)
def test_a_sink_that_cannot_be_used_is_refused_at_create_and_nothing_is_stored(
    cli: Run, pg_server: PrivatePostgres, sink: str, says: str
) -> None:
    if sink == "PG/nosuchdb":
        sink = pg_server.uri(dbname="nosuchdb")
    elif sink == "PG-READER":
        with psycopg.connect(pg_server.dsn(), autocommit=True) as conn:
            conn.execute("DROP ROLE IF EXISTS reader")
            conn.execute("CREATE ROLE reader LOGIN")
        sink = pg_server.uri(user="reader")
    code, _, err = cli("changefeed", "create", "-c", "bad", "--sink-uri", sink)
    assert code == 1 and says in err, err
    assert len(err.strip().splitlines()) == 1  # one line
    assert json.loads(cli("changefeed", "list")[1]) == []


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (("changefeed", "create", "-c", "bad id", "--sink-uri", "delta:///x"), "changefeed id"),
        (("changefeed", "create", "-c", "a", "--sink-uri", "ftp://x/y"), "ftp"),
        (("changefeed", "query", "-c", "nope"), "no changefeed 'nope'"),
        (("capture", "drain", "ghost"), "capture 'ghost' is not alive"),
        (("capture", "remove", "ghost"), "not registered"),
        (("owner", "resign"), "no owner"),
    ],
)
def test_errors_are_one_line_and_non_zero(cli: Run, argv: tuple[str, ...], fragment: str) -> None:
    code, out, err = cli(*argv)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("cdc-dagster: error: ")
    assert fragment in err


def test_update_of_a_running_changefeed_is_refused_and_changes_nothing(cli: Run) -> None:
    assert cli("changefeed", "create", "-c", "run", "--sink-uri", "delta:///tmp/a")[0] == 0
    code, _, err = cli("changefeed", "update", "-c", "run", "--sink-uri", "delta:///tmp/b")
    assert code == 1 and "pause it first" in err
    assert json.loads(cli("changefeed", "query", "-c", "run")[1])["sink_uri"] == "delta:///tmp/a"


def test_bad_config_file_is_refused(cli: Run, tmp_path: Path) -> None:
    config = tmp_path / "cf.toml"
    config.write_text("sync-point-intervl = 3\n")
    code, _, err = cli(
        "changefeed", "create", "-c", "x", "--sink-uri", "delta:///a", "--config", str(config)
    )
    assert code == 1 and "unknown key(s) sync-point-intervl" in err
    assert json.loads(cli("changefeed", "list")[1]) == []


def test_capture_add_list_drain_and_remove(cli: Run, metastore: Metastore) -> None:
    assert cli("capture", "add", "cap-a")[0] == 0
    code, _, err = cli("capture", "drain", "cap-a")
    assert code == 1 and "last alive capture" in err
    assert cli("capture", "add", "cap-b")[0] == 0
    code, _, err = cli("capture", "add", "cap-b")
    assert code == 1 and "already registered" in err
    rows = json.loads(cli("capture", "list")[1])
    assert {r["id"] for r in rows} == {"cap-a", "cap-b"}
    assert all(r["alive"] and r["desired"] for r in rows)
    assert cli("changefeed", "create", "-c", "cf", "--sink-uri", "delta:///tmp/l")[0] == 0
    code, out, err = cli("capture", "drain", "cap-a")
    assert code == 0 and "1 changefeed" in out, err
    assert cli("capture", "remove", "cap-a")[0] == 0
    assert {c.capture_id for c in metastore.captures.list_alive()} == {"cap-b"}
    assert set(metastore.captures.desired()) == {"cap-b"}  # removed: not registered again


def test_table_move_to_unknown_capture_is_refused(cli: Run) -> None:
    assert cli("changefeed", "create", "-c", "cf", "--sink-uri", "delta:///tmp/l")[0] == 0
    code, _, err = cli("table", "move", "-c", "cf", "--table-id", "3", "--capture-id", "nope")
    assert code == 1 and "capture 'nope' is not alive" in err


def test_private_etcd_not_running_says_how_to_start_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--state-dir", str(tmp_path), "changefeed", "list"])
    err = capsys.readouterr().err
    assert code == 1 and "cdc-dagster server start" in err
