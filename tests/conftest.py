"""Fixtures shared by every suite: one private etcd per session, a cluster per test.

Each test gets its own cluster prefix, so tests never see each other's keys.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from cdc_dagster.metastore import KeyLayout, Metastore, connect
from cdc_dagster.testing.etcd import EmbeddedEtcd, EtcdTuning


@pytest.fixture(scope="session")
def load_bench() -> Callable[[str], ModuleType]:
    """``load_bench("name")``: ``bench/name.py`` as a module (``bench/`` is not a package),
    loaded once per process and registered under its name."""
    root = Path(__file__).resolve().parent.parent / "bench"

    def load(name: str) -> ModuleType:
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, root / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedEtcd]:
    """A private etcd for the whole session (short election timeout: 1 s leases work)."""
    server = EmbeddedEtcd(tmp_path_factory.mktemp("etcd"), tuning=EtcdTuning.for_tests())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def etcd_endpoints(etcd_server: EmbeddedEtcd) -> list[str]:
    """``host:port`` endpoints of the session's etcd."""
    return etcd_server.endpoints


@pytest.fixture
def cluster_id() -> str:
    """A cluster id of this test's own, so its keys do not meet other tests' keys."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def layout(cluster_id: str) -> KeyLayout:
    """The key layout of this test's cluster."""
    return KeyLayout(cluster_id)


@pytest.fixture
def metastore(etcd_endpoints: list[str], cluster_id: str) -> Iterator[Metastore]:
    """A metastore on the session etcd, for this test's cluster."""
    ms = connect(etcd_endpoints, cluster_id=cluster_id, retry_timeout_s=10.0)
    try:
        yield ms
    finally:
        ms.close()


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One private PostgreSQL on a free loopback port for the whole session (started on
    first use; skips the test when Debian's postgresql is missing)."""
    from cdc_dagster.testing.servers import EmbeddedServerError, PrivatePostgres

    server = PrivatePostgres(tmp_path_factory.mktemp("pg"))
    try:
        server.start()
    except EmbeddedServerError as exc:
        pytest.skip(f"no private PostgreSQL: {exc}")
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture(autouse=True)
def one_tick_per_capture_run(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Capture runs executed in process by a test tick once (a run that follows its mailbox
    would wait for a sensor nobody evaluates); the e2e tests run the real daemon and keep
    the default, and tests of the follow op set their own."""
    if "e2e" not in request.node.path.parts:
        monkeypatch.setenv("CDC_DAGSTER_CAPTURE_LOOP_S", "0")


# The files that take longest (one to eight minutes each on 2 shared cores), longest first.
# scripts/test.sh gives pytest-xdist whole files (--dist loadfile) in collection order
# (--no-loadscope-reorder): its own order, most tests first, left files of one or two long
# tests for last, and one worker ran a 4-minute file alone at the end.
LONGEST_FIRST = (
    "tests/unit/sim/test_simulator.py",
    "tests/integration/defs/test_capture_follow.py",
    "tests/integration/pipeline/test_spark_connect.py",
    "tests/integration/services/test_run_launcher.py",
    "tests/integration/services/test_server_supervision.py",
    "tests/integration/mysql/test_binlog_puller.py",
    "tests/integration/defs/test_spark_session_recovery.py",
    "tests/integration/mysql/test_cli_mysql_e2e.py",
    "tests/integration/dbt_build/test_postgres_build.py",
    "tests/integration/runtime/test_spark_runtime.py",
    "tests/integration/mysql/test_chunked_snapshot.py",
    "tests/integration/mysql/test_puller_job.py",
    "tests/integration/defs/test_capture_job.py",
    "tests/unit/pipeline/test_background.py",
    "tests/integration/dbt_build/test_consistent_build.py",
    "tests/unit/sim/test_planted_bugs.py",
    "tests/integration/dbt_build/test_definitions.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/e2e is ``serial``: it runs the whole stack (daemon, Spark
    Connect, MariaDB) against timed faults or a browser, so scripts/test.sh runs them alone
    after the others, which it runs on two workers. (The OLTP bench's test, which times
    nothing, ran beside the others once: the whole run took as long, the parallel part
    that much longer.) The files of :data:`LONGEST_FIRST` come first, in its order."""
    for item in items:
        if "e2e" in item.path.parts:
            item.add_marker(pytest.mark.serial)
        elif item.get_closest_marker("serial"):
            # scripts/test.sh collects only tests/e2e for the serial part
            raise pytest.UsageError(
                f"{item.nodeid} is marked serial outside tests/e2e: scripts/test.sh would "
                "run it in neither part; put it under tests/e2e"
            )
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(autouse=True)
def no_spark_connect_mode_left_behind() -> Iterator[None]:
    """A Spark Connect client made in this process switches PySpark into Connect mode for
    good (``SPARK_CONNECT_MODE_ENABLED``): a local session any later test makes fails with
    CONNECT_URL_NOT_SET. So a test leaves the mode as it found it, whatever order the
    tests run in (pytest-xdist's workers each run their own share)."""
    before = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    yield
    if before is None:
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    else:
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = before
