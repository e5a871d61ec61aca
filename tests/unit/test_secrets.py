"""``${ENV_VAR}`` references in URIs, and redaction of literal passwords."""

from __future__ import annotations

import pytest

from cdc_dagster.secrets import SecretReferenceError, redact_text, redact_uri, resolve_uri


def test_resolve_replaces_references_and_percent_encodes_them_in_userinfo() -> None:
    env = {"PG_PASSWORD": "p@ss/w:rd", "PG_HOST": "db"}
    resolved = resolve_uri("postgres://etl:${PG_PASSWORD}@${PG_HOST}:5432/wh", env)
    assert resolved == "postgres://etl:p%40ss%2Fw%3Ard@db:5432/wh"


def test_resolve_names_the_missing_variable_and_never_a_value() -> None:
    with pytest.raises(SecretReferenceError, match="PG_PASSWORD") as raised:
        resolve_uri("postgres://etl:${PG_PASSWORD}@db/wh", {"OTHER": "hunter2"})
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize("uri", ["postgres://u:${1BAD}@db/wh", "postgres://u:${PG@db/wh"])
def test_malformed_references_are_refused(uri: str) -> None:
    with pytest.raises(SecretReferenceError):
        resolve_uri(uri, {})


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("postgres://etl:hunter2@db:5432/wh", "postgres://etl:***@db:5432/wh"),
        ("postgres://etl:hun@ter2@db/wh", "postgres://etl:***@db/wh"),
        ("postgres://etl:${PG_PASSWORD}@db/wh", "postgres://etl:${PG_PASSWORD}@db/wh"),
        ("delta:///lake?token=abc&x=1", "delta:///lake?token=***&x=1"),
        ("postgres://etl@db/wh", "postgres://etl@db/wh"),
    ],
)
def test_redact_hides_literal_passwords_and_keeps_references(uri: str, shown: str) -> None:
    assert redact_uri(uri) == shown


def test_redact_text_finds_uris_inside_json_excerpts() -> None:
    text = '{"sink_uri":"postgres://etl:hunter2@db/wh","x":1}'
    assert "hunter2" not in redact_text(text)
