"""A warm run worker opens its instance ahead; the run it takes gets that instance (not a
new one: 0.2 s of a run's start under load) when the run's instance ref is the same."""

from __future__ import annotations

import sys
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.code_pointer import ModuleCodePointer
from dagster._core.instance.ref import InstanceRef
from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import serialize_value

from cdc_dagster.services import run_worker


def _payload(ref: InstanceRef) -> str:
    """A run's ``ExecuteRunArgs`` as the launcher writes them (only the ref is read here)."""
    pointer = ModuleCodePointer("cdc_dagster.defs", "defs", working_directory=None)
    origin = JobPythonOrigin("quick", RepositoryPythonOrigin(sys.executable, pointer))
    return serialize_value(ExecuteRunArgs(job_origin=origin, run_id="r1", instance_ref=ref))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.setattr(run_worker, "_warm", {})
    # restored after each test, whatever the test left patched
    monkeypatch.setattr(dg.DagsterInstance, "from_ref", dg.DagsterInstance.__dict__["from_ref"])
    return tmp_path


def test_the_run_gets_the_instance_opened_ahead_once(home: Path) -> None:
    assert "instance opened ahead" in run_worker.warm_instance()
    warm = run_worker._warm["instance"]
    ref = InstanceRef.from_dir(str(home))
    assert ref == warm.get_ref()
    run_worker.adopt_instance(run_worker.run_args(_payload(ref)))
    assert dg.DagsterInstance.from_ref(ref) is warm  # as execute_run opens it
    again = dg.DagsterInstance.from_ref(ref)  # once: then as before
    assert again is not warm
    again.dispose()
    warm.dispose()


def test_a_run_of_another_instance_opens_its_own(home: Path, tmp_path_factory) -> None:
    run_worker.warm_instance()
    warm = run_worker._warm["instance"]
    other = InstanceRef.from_dir(str(tmp_path_factory.mktemp("other-home")))
    run_worker.adopt_instance(run_worker.run_args(_payload(other)))
    got = dg.DagsterInstance.from_ref(other)
    assert got is not warm and got.get_ref() == other
    got.dispose()
    assert run_worker._warm == {}  # the one opened ahead was let go


def test_a_payload_not_read_leaves_the_run_to_open_its_own(home: Path) -> None:
    run_worker.warm_instance()
    original = dg.DagsterInstance.__dict__["from_ref"]
    run_worker.adopt_instance(run_worker.run_args("not a run"))
    assert dg.DagsterInstance.__dict__["from_ref"] is original  # nothing handed over
    got = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))
    assert got is not None and run_worker._warm == {}
    got.dispose()


def test_a_worker_warms_up_the_modules_that_say_how(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    calls: list[str] = []
    good = types.ModuleType("warm_good")
    good.warm_up = lambda: calls.append("good")  # type: ignore[attr-defined]
    bad = types.ModuleType("warm_bad")

    def fails() -> None:
        raise RuntimeError("no manifest")

    bad.warm_up = fails  # type: ignore[attr-defined]
    plain = types.ModuleType("warm_plain")
    for m in (good, bad, plain):
        monkeypatch.setitem(sys.modules, m.__name__, m)
    line = run_worker.warm_up(["warm_good", "warm_bad", "warm_plain", "not_imported"])
    assert calls == ["good"] and line == "; warmed up warm_good"


def test_the_code_location_warms_up_the_dbt_models(monkeypatch: pytest.MonkeyPatch) -> None:
    import cdc_dagster.defs as code

    built: list[object] = []
    real = code.dbt_assets_for
    monkeypatch.setattr(code, "dbt_assets_for", lambda: built.append(real()))
    code.warm_up()  # dagster-dbt's manifest caches filled before a run builds its definitions
    assert len(built) == 1 and isinstance(built[0], dg.AssetsDefinition)
