"""What the ``cdc-dagster`` commands share: their error, the state dir, the captures
``--captures N`` names, and changefeed config files (TiCDC-style TOML)."""

from __future__ import annotations

import argparse
import os
import re
import tomllib
from pathlib import Path
from typing import Any

DEFAULT_STATE_DIR = ".state"
MAX_CONFIG_BYTES = 1 << 20
_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?")


class CliError(Exception):
    """A usage error the CLI reports in one line."""


def parse_duration_s(value: object) -> int:
    """``30``, ``"30s"``, ``"10m"``, ``"1h30m"`` -> seconds."""
    if isinstance(value, bool):
        raise CliError(f"sync-point-interval {value!r} is not a duration")
    if isinstance(value, int):
        return value
    match = _DURATION.fullmatch(str(value).strip())
    if not isinstance(value, str) or not value.strip() or match is None:
        raise CliError(f"sync-point-interval {value!r} is not a duration like 30s, 10m or 1h")
    h, m, s = (int(g or 0) for g in match.groups())
    return h * 3600 + m * 60 + s


def load_changefeed_config(path: Path) -> dict[str, Any]:
    """A changefeed config file (TiCDC-style TOML) as create/update keyword arguments."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read config {path}: {exc.strerror}") from exc
    if len(data) > MAX_CONFIG_BYTES:
        raise CliError(
            f"config {path} is {len(data)} bytes; a changefeed config is a small TOML file "
            f"(at most {MAX_CONFIG_BYTES})"
        )
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CliError(
            f"config {path} is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x}); "
            "a changefeed config is a TOML file"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise CliError(f"config {path} is not valid TOML: {exc}") from exc
    known = {"filter", "sync-point-interval", "enable-sync-point", "target-ts"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise CliError(
            f"config {path}: unknown key(s) {', '.join(unknown)}; known: {sorted(known)}"
        )
    out: dict[str, Any] = {}
    rules = raw.get("filter", {}).get("rules")
    if rules is not None:
        if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
            raise CliError(f"config {path}: [filter] rules must be a list of strings")
        out["table_filter"] = tuple(rules)
    if raw.get("enable-sync-point", True) is False:
        out["sync_point_interval_s"] = 0
    elif "sync-point-interval" in raw:
        out["sync_point_interval_s"] = parse_duration_s(raw["sync-point-interval"])
    if "target-ts" in raw:
        out["target_ts"] = int(raw["target-ts"])
    return out


def capture_names(count: int) -> list[str]:
    """``capture-1`` .. ``capture-<count>``: the captures ``--captures N`` asks for."""
    if count < 0:
        raise CliError(f"--captures {count}: give 0 or more")
    return [f"capture-{i}" for i in range(1, count + 1)]


def state_dir_of(args: argparse.Namespace) -> Path:
    """The state dir: ``--state-dir``, ``$CDC_DAGSTER_STATE_DIR``, else ``./.state``."""
    chosen = args.state_dir or os.environ.get("CDC_DAGSTER_STATE_DIR") or DEFAULT_STATE_DIR
    return Path(chosen).resolve()
