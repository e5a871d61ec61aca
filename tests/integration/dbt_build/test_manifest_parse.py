"""The dbt project's manifest when several processes need it at once (the code server, run
workers, two builds, two test workers): one ``dbt parse``, and every process reads a whole
manifest, never one another process is rewriting."""

from __future__ import annotations

import json
import multiprocessing
import shutil
from pathlib import Path

from cdc_dagster.dbt import build


def _load(project: str, parses: str, out: str) -> None:
    """A process loading the manifest; each ``dbt parse`` it runs is noted in ``parses``."""
    real = build.run_dbt

    def counted(project_dir, args, env=None):  # type: ignore[no-untyped-def]
        if args[:1] == ["parse"]:
            with open(parses, "a") as f:
                f.write("parse\n")
        return real(project_dir, args, env)

    build.run_dbt = counted  # type: ignore[assignment]
    manifest = build.load_manifest(Path(project), str(Path(project) / "x.duckdb"))
    Path(out).write_text(json.dumps(sorted(manifest["nodes"])))


def test_processes_loading_a_missing_manifest_at_once_parse_once_and_read_it_whole(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    shutil.copytree(build.PROJECT_DIR, project, ignore=shutil.ignore_patterns("target", "logs"))
    parses = tmp_path / "parses"
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_load, args=(str(project), str(parses), str(tmp_path / f"out{i}")))
        for i in range(3)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert parses.read_text().splitlines() == ["parse"]  # one parse for the three of them
    nodes = {(tmp_path / f"out{i}").read_text() for i in range(3)}
    assert len(nodes) == 1 and any(n.startswith("model.") for n in json.loads(nodes.pop()))
    left = sorted(p.name for p in (project / "target").iterdir())
    assert left == [".parse-lock", "manifest.json"]  # no parse directory left behind
