"""Upstream connections share one TLS context where they are given no TLS option."""

from __future__ import annotations

from cdc_dagster.mysql.upstream import Connection


def test_connections_without_tls_options_share_one_context_and_others_get_their_own() -> None:
    """pymysql prefers TLS when given no option and made a context per connection (the CA
    bundle read each time); ours is made once and shared, and verifies as pymysql's would
    (nothing: a preferred TLS); a connection with TLS options gets a context of its own."""
    import ssl

    a = Connection(host="127.0.0.1", defer_connect=True)
    b = Connection(host="127.0.0.1", defer_connect=True)
    assert a.ssl and not a._ssl_required  # preferred: used where the server offers it
    assert a.ctx is b.ctx
    assert a.ctx.verify_mode == ssl.CERT_NONE and not a.ctx.check_hostname
    c = Connection(host="127.0.0.1", defer_connect=True,
                   ssl={"check_hostname": False, "verify_mode": False})  # fmt: skip
    assert c.ctx is not a.ctx and c._ssl_required
