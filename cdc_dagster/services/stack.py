"""``server start|stop|status`` and ``demo``: etcd, Spark Connect, Dagster (and the workload).

Everything lives in the state dir: ``etcd/`` (private etcd), ``spark/`` (Spark Connect logs),
``dagster/`` (``DAGSTER_HOME``), ``changelog/`` and ``lake/`` (the demo's upstream and
Delta root), ``services.json`` (what is running). The Dagster processes learn where
everything is from ``CDC_DAGSTER_*`` environment variables, read by resources at run time.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from cdc_dagster.services import procs
from cdc_dagster.services.dagster_home import WORKSPACE_YAML, dagster_home

DEMO_CHANGEFEED = "demo"
DEMO_CAPTURES = ("capture-1", "capture-2")
VENV_BIN = Path(sys.executable).parent


def say(message: str) -> None:
    """One progress line."""
    print(f"[cdc-dagster] {message}", flush=True)


def spark_home() -> Path:
    """The pyspark wheel's directory (it ships ``sbin/start-connect-server.sh``)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def start_spark_connect(state_dir: Path, timeout_s: float = 120.0) -> tuple[procs.Service, object]:
    """A Spark Connect server on a free loopback port, as a child process group."""
    port = procs.free_port()
    spark_dir = state_dir / "spark"
    log = spark_dir / "connect.log"
    home = spark_home()
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOG_DIR": str(spark_dir / "logs"),
        "SPARK_PID_DIR": str(spark_dir),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
    }
    argv = [
        "bash",
        str(home / "sbin" / "start-connect-server.sh"),
        "--wait",
        "--master",
        "local[2]",
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.shuffle.partitions=4",
    ]
    proc = procs.launch("spark-connect", argv, log, env)
    procs.wait_port(port, proc, "Spark Connect server", log, timeout_s)
    return procs.Service("spark-connect", proc.pid, str(log), f"sc://127.0.0.1:{port}"), proc


def dagster_env(
    state_dir: Path, etcd: str, spark_remote: str, changelog: Path | None
) -> dict[str, str]:
    """The environment of ``dagster dev`` and everything it starts."""
    env = {
        **os.environ,
        "DAGSTER_HOME": str(dagster_home(state_dir)),
        "CDC_DAGSTER_STATE_DIR": str(state_dir),
        "CDC_DAGSTER_ETCD": etcd,
        "CDC_DAGSTER_SPARK_REMOTE": spark_remote,
        "DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS": "60",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(WORKSPACE_YAML.parent), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    if changelog is not None:
        env["CDC_DAGSTER_CHANGELOG"] = str(changelog)
    return env


def start_dagster(
    state_dir: Path, env: dict[str, str], port: int, timeout_s: float = 180.0
) -> tuple[procs.Service, object]:
    """``dagster dev -w workspace.yaml`` (webserver, daemon, code server) on a loopback port."""
    port = port or procs.free_port()
    log = state_dir / "dagster" / "dagster-dev.log"
    argv = [
        str(VENV_BIN / "dagster"),
        "dev",
        "-w",
        str(WORKSPACE_YAML),
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    proc = procs.launch("dagster-dev", argv, log, env, cwd=WORKSPACE_YAML.parent)
    url = f"http://127.0.0.1:{port}"
    procs.wait_http(f"{url}/server_info", proc, "dagster dev", log, timeout_s)
    return procs.Service("dagster-dev", proc.pid, str(log), url), proc


def _start_etcd(state_dir: Path, etcd: str | None, quiet: bool = False) -> str:
    if etcd:
        if not quiet:
            say(f"using the etcd cluster at {etcd}")
        return etcd
    from cdc_dagster.metastore.private_etcd import start_private_etcd

    say(f"starting the private etcd under {state_dir / 'etcd'} ...")
    status = start_private_etcd(state_dir)
    say(f"etcd {'started' if status.started else 'already running'} at {status.client_url}")
    if status.started:
        _STARTED_ETCD.append(state_dir)
    return ",".join(status.endpoints)


# State dirs whose private etcd this process started (stopped again on the way out).
_STARTED_ETCD: list[Path] = []


def _stop_started_etcd() -> None:
    from cdc_dagster.metastore.private_etcd import stop_private_etcd

    while _STARTED_ETCD:
        state_dir = _STARTED_ETCD.pop()
        say("stopping the private etcd ...")
        stop_private_etcd(state_dir)


@contextmanager
def _running(state_dir: Path) -> Iterator[list[procs.Service]]:
    """Record started services; stop them (newest first) on the way out."""
    existing = [s for s in procs.read_services(state_dir) if procs.pid_alive(s.pid)]
    if existing:
        names = ", ".join(f"{s.name} (pid {s.pid})" for s in existing)
        raise procs.ServiceError(
            f"{names} already running for {state_dir}; stop them with `cdc-dagster server stop`"
        )
    started: list[procs.Service] = []
    try:
        yield started
    finally:
        for service in reversed(started):
            say(f"stopping {service.name} (pid {service.pid}) ...")
            procs.terminate(service.pid)
        procs.write_services(state_dir, [])
        _stop_started_etcd()


def _wait_forever(check: Callable[[], str | None]) -> None:
    stop = threading.Event()
    # Ctrl-C as well as SIGTERM, also when started with SIGINT ignored (a background job
    # of a script, nohup): Python raises KeyboardInterrupt only if SIGINT was not ignored.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(2.0):
        problem = check()
        if problem:
            say(problem)
            return


def _bring_up(
    state_dir: Path,
    started: list[procs.Service],
    etcd: str | None,
    port: int,
    dagster: bool,
    changelog: Path | None,
) -> tuple[str, dict[str, object]]:
    etcd_endpoints = _start_etcd(state_dir, etcd, quiet=changelog is not None)
    say("starting a Spark Connect server (from the pyspark wheel) ...")
    spark, spark_proc = start_spark_connect(state_dir)
    started.append(spark)
    procs.write_services(state_dir, started)
    say(f"Spark Connect at {spark.address}")
    children: dict[str, object] = {"spark-connect": spark_proc}
    if dagster:
        say("starting `dagster dev -w workspace.yaml` (webserver, daemon, code server) ...")
        env = dagster_env(state_dir, etcd_endpoints, spark.address, changelog)
        ui, ui_proc = start_dagster(state_dir, env, port)
        started.append(ui)
        procs.write_services(state_dir, started)
        children["dagster-dev"] = ui_proc
        say(f"Dagster UI at {ui.address}")
    return etcd_endpoints, children


def _liveness(children: dict[str, object]) -> Callable[[], str | None]:
    def check() -> str | None:
        for name, proc in children.items():
            code = proc.poll()  # type: ignore[attr-defined]
            if code is not None:
                return f"{name} exited with {code}; stopping everything"
        return None

    return check


def serve(state_dir: Path, *, etcd: str | None, port: int = 0, dagster: bool = True) -> None:
    """``server start``: etcd, Spark Connect and Dagster, until Ctrl-C or ``server stop``."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with _running(state_dir) as started:
        try:
            _, children = _bring_up(state_dir, started, etcd, port, dagster, None)
            say("running; Ctrl-C (or `cdc-dagster server stop`) stops what this started")
            _wait_forever(_liveness(children))
        except KeyboardInterrupt:
            say("interrupted")


def stop(state_dir: Path) -> None:
    """``server stop``: the recorded services, then the private etcd."""
    for service in reversed(procs.read_services(state_dir)):
        if procs.pid_alive(service.pid):
            say(f"stopping {service.name} (pid {service.pid}) ...")
            procs.terminate(service.pid)
    procs.write_services(state_dir, [])
    from cdc_dagster.metastore.private_etcd import stop_private_etcd

    say("private etcd stopped" if stop_private_etcd(state_dir) else "no private etcd was running")


def status_lines(state_dir: Path) -> list[str]:
    """``server status``: one line per part."""
    from cdc_dagster.metastore.private_etcd import private_etcd_status

    etcd = private_etcd_status(state_dir)
    lines = [
        f"etcd: running (pid {etcd.pid}) at {etcd.client_url}, {etcd.version}"
        if etcd.running
        else "etcd: not running"
    ]
    services = procs.read_services(state_dir)
    for service in services:
        alive = procs.pid_alive(service.pid)
        lines.append(
            f"{service.name}: {'running' if alive else 'dead'} (pid {service.pid}) {service.address}".rstrip()
        )
    if not services:
        lines.append("spark-connect, dagster-dev: not running")
    return lines


def demo(state_dir: Path, *, tables: int = 6, port: int = 0, dagster: bool = True) -> None:
    """``demo``: :func:`serve` plus the embedded generator and a changefeed into a Delta root."""
    from cdc_dagster.services import workload

    state_dir.mkdir(parents=True, exist_ok=True)
    changelog = state_dir / "changelog"
    with _running(state_dir) as started:
        generator = None
        try:
            etcd_endpoints = _start_etcd(state_dir, None)
            say(f"starting the embedded generator ({tables} bank tables) into {changelog} ...")
            generator = workload.GeneratorThread(changelog, tables)
            generator.start()
            say(f"generator writing; {generator.describe()}")
            lake = state_dir / "lake"
            _, children = _bring_up(state_dir, started, etcd_endpoints, port, dagster, changelog)
            # After Dagster is up: capture leases are renewed by capture runs, which need it.
            say(
                workload.ensure_demo_changefeed(
                    etcd_endpoints,
                    state_dir,
                    DEMO_CHANGEFEED,
                    lake,
                    DEMO_CAPTURES,
                    changelog,
                    generator.start_ts,
                )
            )
            ui = next((s.address for s in started if s.name == "dagster-dev"), "")
            for line in workload.what_to_look_at(ui, DEMO_CHANGEFEED, lake):
                say(line)
            _wait_forever(_liveness(children))
        except KeyboardInterrupt:
            say("interrupted")
        finally:
            if generator is not None:
                generator.stop()
                say("generator stopped")
