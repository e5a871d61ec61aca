"""External clusters with authentication and TLS: real etcd servers of this test's own."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from pyetcd import etcdrpc

from cdc_dagster.metastore import EtcdAuthError, TlsConfig, connect
from cdc_dagster.testing.etcd import EmbeddedEtcd, EtcdTuning


def _enable_auth(endpoint: str, root_password: str) -> None:
    channel = grpc.insecure_channel(endpoint)
    auth = etcdrpc.AuthStub(channel)
    auth.UserAdd(etcdrpc.AuthUserAddRequest(name="root", password=root_password), 5)
    auth.RoleAdd(etcdrpc.AuthRoleAddRequest(name="root"), 5)
    auth.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user="root", role="root"), 5)
    auth.AuthEnable(etcdrpc.AuthEnableRequest(), 5)
    channel.close()


@pytest.fixture
def auth_etcd(tmp_path: Path) -> Iterator[EmbeddedEtcd]:
    """An etcd with authentication enabled; user root, password s3cret."""
    server = EmbeddedEtcd(tmp_path / "etcd", tuning=EtcdTuning.for_tests()).start()
    try:
        _enable_auth(server.endpoints[0], "s3cret")
        yield server
    finally:
        server.stop()


def test_without_credentials_an_auth_enabled_etcd_gives_a_clear_error(
    auth_etcd: EmbeddedEtcd,
) -> None:
    with (
        connect(auth_etcd.endpoints, retry_timeout_s=3) as ms,
        pytest.raises(EtcdAuthError, match=r"authentication enabled.*password"),
    ):
        ms.client.get("/x")


def test_a_wrong_password_is_refused_clearly_and_never_shown(auth_etcd: EmbeddedEtcd) -> None:
    with pytest.raises(EtcdAuthError) as refused:
        connect(auth_etcd.endpoints, user="root", password="wrong-pw", retry_timeout_s=3)
    assert "wrong-pw" not in str(refused.value)


def test_with_credentials_the_metastore_works_on_an_auth_enabled_etcd(
    auth_etcd: EmbeddedEtcd,
) -> None:
    with connect(auth_etcd.endpoints, user="root", password="s3cret", retry_timeout_s=5) as ms:
        assert "s3cret" not in repr(ms.client)
        ms.changefeeds.create("orders", "delta:///lake")
        owner = ms.election.campaign("owner", 2, timeout_s=5)
        capture = ms.captures.register("cap", 2)
        seen = ms.captures.watch(lambda alive: None)
        try:
            assert seen.wait_for(lambda alive: set(alive) == {"cap"}, 5)
            owner.keeper.refresh()
            assert ms.read_owner_snapshot().changefeeds["orders"].info.sink_uri == "delta:///lake"
        finally:
            seen.stop()
            capture.deregister()
            owner.resign()


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "server.pem", tmp_path / "server-key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def test_tls_connection_to_an_etcd_with_a_self_signed_certificate(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server = EmbeddedEtcd(tmp_path / "etcd", tuning=EtcdTuning.for_tests(), tls=(cert, key))
    server.start()
    try:
        url = f"https://{server.endpoints[0]}"
        with connect([url], tls=TlsConfig(ca_cert=str(cert)), retry_timeout_s=5) as ms:
            ms.client.put("/tls", b"yes")
            assert ms.client.get("/tls").value == b"yes"
    finally:
        server.stop()


def test_an_expired_auth_token_is_renewed_without_the_caller_noticing(tmp_path: Path) -> None:
    server = EmbeddedEtcd(
        tmp_path / "etcd", tuning=EtcdTuning.for_tests(), extra_args=("--auth-token-ttl=1",)
    ).start()
    try:
        _enable_auth(server.endpoints[0], "s3cret")
        with connect(server.endpoints, user="root", password="s3cret", retry_timeout_s=5) as ms:
            ms.client.put("/a", b"1")
            time.sleep(2.5)  # the simple token expires after 1 s without use
            ms.client.put("/b", b"2")
            assert ms.client.get("/a").value == b"1"
    finally:
        server.stop()
