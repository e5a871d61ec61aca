"""``server start|stop|status`` and ``demo``: etcd, Spark Connect, Dagster (and the workload).

The process that runs ``server start`` or ``demo`` is the supervisor of these parts:

=================  ============================================  ======================
part               command                                       ready when
=================  ============================================  ======================
etcd               the private etcd (unless ``--etcd``)          /health answers
spark-connect      pyspark's ``start-connect-server.sh --wait``  its port listens
code-server        ``dagster api grpc -m cdc_dagster.defs``      its port listens
dagster-daemon     ``dagster-daemon run``                        launched
dagster-webserver  ``dagster-webserver``                         /server_info answers
generator          (demo) the workload thread                    started
=================  ============================================  ======================

Each part that dies is restarted with backoff (:mod:`cdc_dagster.services.supervise`);
none is a reason to stop the others. Ports are kept (``ports.json``, and etcd's own), so
a restarted part is where the others look for it: the daemon and webserver reach the
code server through ``<state dir>/dagster/workspace.yaml`` (no reload needed), runs
reach Spark Connect and etcd through ``CDC_DAGSTER_*`` variables fixed at start.

Everything lives in the state dir: ``etcd/`` (private etcd), ``spark/`` (Spark Connect
logs), ``dagster/`` (``DAGSTER_HOME`` and the Dagster logs), ``changelog/`` and ``lake/``
(the demo's upstream and Delta root), ``services.json`` (supervisor and parts),
``ports.json``, ``server.log`` (a detached supervisor's output).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc_dagster.pipeline.background import set_autogroup_nice
from cdc_dagster.pipeline.engine import connect_server_conf
from cdc_dagster.services import procs
from cdc_dagster.services.dagster_home import LOCATION_NAME, WORKSPACE_YAML, grpc_workspace
from cdc_dagster.services.supervise import (
    AdoptedHandle,
    Backoff,
    Handle,
    Part,
    ProcessHandle,
    Supervisor,
)

DEMO_CHANGEFEED = "demo"
DEMO_CAPTURES = ("capture-1", "capture-2")
VENV_BIN = Path(sys.executable).parent
DEFAULT_OWNER_WAIT_S = "3.5"  # the owner sensor's wait budget (CDC_DAGSTER_OWNER_WAIT_S):
# set when the daemon woke every 5 s, so that with its handling of the result (0.3-1.4 s)
# an evaluation ended before the next wake; the loop now wakes every second
STOP_GRACE_S = 2.0  # SIGTERM, then SIGKILL: a stop takes at most this + 1 s
SERVER_LOG = "server.log"

SPARK, CODE, DAEMON, WEB, ETCD, GENERATOR = (
    "spark-connect",
    "code-server",
    "dagster-daemon",
    "dagster-webserver",
    "etcd",
    "generator",
)
DAGSTER_PARTS = (CODE, DAEMON, WEB)


WARM_TIMEOUT_S = 300.0  # the snapshot session's warm-up at start is given up after this


def say(message: str) -> None:
    """One progress line."""
    print(f"[cdc-dagster] {message}", flush=True)


class AlreadyRunningError(procs.ServiceError):
    """A supervisor already runs for this state dir."""


def spark_home() -> Path:
    """The pyspark wheel's directory (it ships ``sbin/start-connect-server.sh``)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


# ------------------------------------------------------------------------------ parts
def _kill_leftovers(handle: Handle) -> None:
    """Before a relaunch: SIGKILL what is left of the dead part's group (a JVM whose
    wrapper died would hold the port)."""
    handle.target().send(signal.SIGKILL)


SPARK_NICE_ENV = "CDC_DAGSTER_SPARK_NICE"


def spark_nice() -> int:
    """The autogroup niceness of the embedded Spark Connect server's session:
    ``CDC_DAGSTER_SPARK_NICE``, 0-19 (default 10; 0: as every other session).

    Linux's autogroup scheduling shares the CPU between sessions first and applies a
    niceness only within one. The server is a session of its own (``procs.launch``); at an
    equal share with the daemon's session, whose capture runs tick the binlog stream, a
    snapshot's Spark reads took as much CPU as the stream's Delta MERGEs on 2 cores, and
    the stream lagged 6-10 s more while they ran (its ticks 3.8-5.0 s instead of 1.1-1.5).
    At 10 the server's session gets about a tenth of what a busy session gets when the CPU
    is short, and an idle CPU whole: the stream's captures come first, the Spark work --
    snapshot reads, a backlog's Spark jobs -- takes what they leave (as the captures' own
    bulk phases do: ``pipeline.background``)."""
    raw = os.environ.get(SPARK_NICE_ENV, "").strip()
    if not raw:
        return 10
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= 19:
        raise procs.ServiceError(f"{SPARK_NICE_ENV}={raw!r}: expected an integer 0-19")
    return value


def spark_connect_part(state_dir: Path, port: int) -> Part:
    """A Spark Connect server on ``127.0.0.1:port``."""
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
    argv = ["bash", str(home / "sbin" / "start-connect-server.sh"), "--wait"]
    # Task slots of the embedded Spark: CDC_DAGSTER_SPARK_CORES (default 2, this machine's)
    argv += ["--master", f"local[{int(os.environ.get('CDC_DAGSTER_SPARK_CORES', '2'))}]"]
    for key, value in connect_server_conf(port).items():
        argv += ["--conf", f"{key}={value}"]
    nice = spark_nice()

    def launch() -> Handle:
        proc = procs.launch(SPARK, argv, log, env)
        if nice and not set_autogroup_nice(proc.pid, nice):
            say(f"spark-connect: its CPU share not lowered (autogroup niceness {nice} refused "
                f"or no autogroups here; {SPARK_NICE_ENV})")  # fmt: skip
        return ProcessHandle(proc)

    return Part(
        SPARK,
        launch,
        ready=lambda _: procs.listening(port),
        address=f"sc://127.0.0.1:{port}",
        log=str(log),
        before_restart=_kill_leftovers,
        on_ready=lambda _: _warm_snapshot_session(f"sc://127.0.0.1:{port}"),
    )


def warm_snapshot_session(remote: str, keep_s: float = 0.0) -> None:
    """The snapshot runs' shared Spark session on ``remote``: its Python workers started and
    their imports done (``mysql.snapshot_runner.warm_imports``), so a first snapshot's reads
    start at once, not 2-5 s into its job. With ``keep_s`` > 0: then ``WARMED`` on standard
    output, and the same job every ``keep_s`` seconds until standard input ends (the stack's
    supervisor holds it: the process exits at once) or ``KEEP_FAILURES`` of them in a row
    failed (Spark Connect restarted: its new server gets a keeper of its own). Spark retires
    a Python worker idle for a minute (``PythonWorkerFactory``), and a snapshot coming later
    started new ones and imported the chunk readers again: 3 s before its first read beside
    a stream."""
    if keep_s > 0:
        # its input's end (the supervisor gone) ends the process at once, even in the middle
        # of a call whose server is gone (Spark Connect's client retries for minutes): from
        # the start (a keeper whose supervisor died while it opened the session lingered)
        threading.Thread(target=_exit_at_end_of_input, name="input", daemon=True).start()
        # a Ctrl-C in the terminal reaches it too: the supervisor ends it (its input), so the
        # stack's log does not say "no longer kept warm (KeyboardInterrupt)" on every stop
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    from cdc_dagster.mysql.snapshot_runner import SNAPSHOT_SESSION, warm_imports
    from cdc_dagster.pipeline.engine import shared_session
    from cdc_dagster.pipeline.job import parallelism

    spark = shared_session(remote, SNAPSHOT_SESSION)

    def warm() -> None:  # one task per slot a snapshot's reads spread over
        n = parallelism(spark)
        spark.range(0, n, 1, n).mapInArrow(warm_imports, "id long").collect()

    try:
        warm()
        if keep_s <= 0:
            return
        print(WARMED, flush=True)
        failures = 0
        while failures < KEEP_FAILURES:
            time.sleep(keep_s)
            try:
                warm()
                failures = 0
            except Exception as exc:  # the server gone or busy: again, up to KEEP_FAILURES
                failures += 1
                print(f"keeping the snapshot session warm failed: {exc}", file=sys.stderr)
        if failures:
            raise SystemExit(1)
    finally:
        spark.stop()  # closes this client only: the session is shared


def _exit_at_end_of_input() -> None:
    """Exit the process once standard input ends (its writer is gone)."""
    sys.stdin.read()
    os._exit(0)


WARMED = "snapshot session warm"
_keeper: subprocess.Popen[str] | None = None  # the snapshot session's keeper of this process
KEEP_WARM_S = 40.0  # the snapshot session's no-op job this often (Spark: idle workers 60 s)
KEEP_FAILURES = 3
_WARM = (
    "import sys; from cdc_dagster.services.stack import warm_snapshot_session as w; "
    "w(sys.argv[1], float(sys.argv[2]))"
)


def _warm_snapshot_session(remote: str, keep_s: float = KEEP_WARM_S) -> subprocess.Popen[str]:
    """``warm_snapshot_session`` in a process of its own (a Spark Connect client switches
    PySpark into Connect mode for its whole process: a local session there fails after it),
    kept warm while this process lives (its standard input), watched in a thread; its
    outcome goes to the stack's log; a keeper started before (of a Spark Connect server
    since restarted) is ended. The keeper's process."""
    global _keeper
    if _keeper is not None and _keeper.stdin is not None:
        with contextlib.suppress(OSError):
            _keeper.stdin.close()
    proc = _keeper = subprocess.Popen([sys.executable, "-c", _WARM, remote, str(keep_s)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip

    def watch() -> None:  # reads the keeper's output as it comes: only its last line is kept
        started = time.monotonic()
        timer = threading.Timer(WARM_TIMEOUT_S, proc.kill)
        timer.start()
        assert proc.stdout is not None
        warmed, last = False, ""
        for line in proc.stdout:
            if not warmed and line.strip() == WARMED:
                warmed = True
                timer.cancel()
                say(f"spark-connect: snapshot session warmed in {time.monotonic() - started:.1f}s")
            elif line.strip():
                last = line
        timer.cancel()
        code = proc.wait()
        why = " ".join((last or f"exited with {code}").split())[:300]
        if warmed:
            if code != 0:
                say(f"spark-connect: snapshot session no longer kept warm ({why})")
            return
        if code < 0 and time.monotonic() - started >= WARM_TIMEOUT_S:
            why = f"no answer in {WARM_TIMEOUT_S:.0f} s"
        # a snapshot then warms it itself
        say(f"spark-connect: snapshot session not warmed ({why})")

    threading.Thread(target=watch, name="warm-snapshot-session", daemon=True).start()
    return proc


def dagster_env(
    state_dir: Path, etcd: str, spark_remote: str, changelog: Path | None
) -> dict[str, str]:
    """The environment of the Dagster processes and every run they start."""
    from cdc_dagster.services.dagster_home import dagster_home

    env = {
        **os.environ,
        "DAGSTER_HOME": str(dagster_home(state_dir)),
        "CDC_DAGSTER_STATE_DIR": str(state_dir),
        "CDC_DAGSTER_ETCD": etcd,
        "CDC_DAGSTER_SPARK_REMOTE": spark_remote,
        "DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS": "60",
        # The owner sensor ticks on etcd changes for 3.5 s an evaluation; the daemon's sensor
        # loop wakes every second (services/run_coordinator.py) and skips a sensor still
        # evaluating: cdc_dagster/defs/owner/wait.py.
        "CDC_DAGSTER_OWNER_WAIT_S": os.environ.get(
            "CDC_DAGSTER_OWNER_WAIT_S", DEFAULT_OWNER_WAIT_S
        ),
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(WORKSPACE_YAML.parent), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    if changelog is not None:
        env["CDC_DAGSTER_CHANGELOG"] = str(changelog)
    return env


def _dagster_part(
    name: str, argv: Sequence[str], log: Path, env: dict[str, str], **kw: Any
) -> Part:
    def launch() -> Handle:
        return ProcessHandle(procs.launch(name, argv, log, env, cwd=WORKSPACE_YAML.parent))

    return Part(name, launch, log=str(log), **kw)


def dagster_parts(state_dir: Path, env: dict[str, str], code_port: int, ui_port: int) -> list[Part]:
    """The code server (on ``code_port``), the daemon and the webserver (on ``ui_port``).

    Three processes rather than ``dagster dev``: ``dagster dev`` ends when its daemon or
    webserver dies, and its code server's child, once killed, stays dead until a manual
    reload. Here each is restarted alone, the code server on the same port.
    """
    logs = state_dir / "dagster"
    workspace = str(grpc_workspace(state_dir, code_port))
    code = [
        str(VENV_BIN / "dagster"),
        "api",
        "grpc",
        "--module-name",
        "cdc_dagster.defs",
        "--location-name",
        LOCATION_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(code_port),
        "--use-python-environment-entry-point",
    ]
    daemon = [str(VENV_BIN / "dagster-daemon"), "run", "-w", workspace]
    web = [str(VENV_BIN / "dagster-webserver"), "-w", workspace, "-h", "127.0.0.1"]
    ui = f"http://127.0.0.1:{ui_port}"
    return [
        _dagster_part(
            CODE,
            code,
            logs / "code-server.log",
            env,
            ready=lambda _: procs.listening(code_port),
            address=f"grpc://127.0.0.1:{code_port}",
        ),
        _dagster_part(DAEMON, daemon, logs / "daemon.log", env),
        _dagster_part(
            WEB,
            [*web, "-p", str(ui_port)],
            logs / "webserver.log",
            env,
            ready=lambda _: procs.http_ok(f"{ui}/server_info"),
            address=ui,
        ),
    ]


def prepare_instance(state_dir: Path, env: dict[str, str], timeout_s: float = 180.0) -> None:
    """Create (or migrate) the Dagster instance's storage before its processes start: the
    daemon and webserver starting together on a fresh SQLite storage would both stamp its
    schema ("more than one head present"); ``dagster dev`` does this in its own process."""
    log = state_dir / "dagster" / "instance-migrate.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        try:
            done = subprocess.run(
                [str(VENV_BIN / "dagster"), "instance", "migrate"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise procs.ServiceError(
                f"`dagster instance migrate` took over {timeout_s:.0f}s; see {log}"
            ) from None
    if done.returncode != 0:
        raise procs.ServiceError(
            f"`dagster instance migrate` failed with exit code {done.returncode}; see {log}"
        )


@dataclass
class EtcdHandle:
    """The private etcd: detached by design (it outlives any client), so not our child."""

    pid: int
    log: Path

    def exit_note(self) -> str | None:
        """None while it runs; it is reaped by init, so its exit code is not known here."""
        if procs.pid_alive(self.pid):
            return None
        return f"gone (exit code unknown: it runs detached; see {self.log})"

    def target(self) -> procs.Target:
        """The etcd process alone."""
        return procs.Target(self.pid)

    def close(self) -> None:
        """Nothing to release."""


def etcd_part(state_dir: Path) -> Part:
    """The private etcd of the state dir (attached to when it already runs)."""
    part = Part(
        ETCD, lambda: _start_etcd(state_dir, part), log=str(state_dir / "etcd" / "etcd.log")
    )
    return part


def _start_etcd(state_dir: Path, part: Part) -> Handle:
    from cdc_dagster.metastore.errors import MetastoreError
    from cdc_dagster.metastore.private_etcd import start_private_etcd

    try:
        status = start_private_etcd(state_dir, timeout_s=20.0)
    except MetastoreError as exc:
        raise procs.ServiceError(str(exc)) from exc
    part.address = status.client_url or ""
    return EtcdHandle(status.pid or 0, status.log_path)


@dataclass
class _GeneratorStop:
    generator: Any

    def send(self, sig: int) -> None:
        self.generator.request_stop()

    def alive(self, table: procs.ProcTable | None = None) -> bool:
        return bool(self.generator.alive())


@dataclass
class GeneratorHandle:
    """The demo's workload thread (in the supervisor's process)."""

    generator: Any  # workload.GeneratorThread
    pid: int = 0

    def exit_note(self) -> str | None:
        """None while it steps; else its error."""
        return None if self.generator.alive() else f"stopped: {self.generator.error!r}"

    def target(self) -> _GeneratorStop:
        """Stopping it: the thread ends after its step."""
        return _GeneratorStop(self.generator)

    def close(self) -> None:
        """Release the change log's writer lock."""
        self.generator.stop()


# ------------------------------------------------------------------------------ the stack
class Stack:
    """The supervised parts of ``server start`` / ``demo`` on one state dir.

    ``with Stack(...) as stack:`` starts what is missing (adopting parts an earlier,
    dead supervisor left running), ``stack.supervise()`` restarts what dies until ``stop``
    is set, and leaving the block stops every part (also the private etcd).
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        kind: str = "server",
        etcd: str | None = None,
        ui_port: int = 0,
        dagster: bool = True,
        changelog: Path | None = None,
        generator: Callable[[], Any] | None = None,
        stop: threading.Event | None = None,
        backoff: Backoff | None = None,
        cluster_id: str = "default",
        before_dagster: Callable[[Stack], None] | None = None,
    ) -> None:
        self.state_dir = state_dir.resolve()
        self.cluster_id = cluster_id
        # Runs once etcd (and the generator) are up, before the Dagster processes start: what
        # it puts in etcd (the demo's changefeed) is in the code location's catalog at once.
        self.before_dagster = before_dagster
        self.kind = kind
        self.external_etcd = etcd or ""
        self.ui_port = ui_port
        self.dagster = dagster
        self.changelog = changelog
        self.make_generator = generator
        self.stop = stop or threading.Event()
        self.supervisor = Supervisor(say, backoff or Backoff(), on_change=self._record)
        self.etcd_endpoints = self.external_etcd
        self.spark_remote = ""
        self.ui_url = ""
        self.generator: Any = None
        self._me = procs.Service("supervisor", os.getpid(), started=procs.start_ticks(os.getpid()))

    def __enter__(self) -> Stack:
        try:
            self.bring_up()
        except BaseException:
            self.shut_down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.shut_down()

    # -------------------------------------------------------------- start
    def bring_up(self) -> None:
        """Start (or adopt) every part and wait until all are ready (or ``stop`` is set)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        before = procs.read_record(self.state_dir)
        if before.supervisor is not None and before.supervisor.alive():
            raise AlreadyRunningError(
                f"a supervisor (pid {before.supervisor.pid}, {before.kind or 'server'}) already "
                f"runs for {self.state_dir} and restarts any part that dies; "
                "`cdc-dagster server status` shows the parts, `cdc-dagster server stop` stops them"
            )
        self._set_state("starting")
        if not self.external_etcd:
            self.supervisor.add(etcd_part(self.state_dir))
            say(f"starting the private etcd under {self.state_dir / 'etcd'} ...")
            self.supervisor.start(self.stop)
            self.etcd_endpoints = self.supervisor.slots[ETCD].part.address.removeprefix("http://")
            say(f"etcd at {self.etcd_endpoints}")
        else:
            say(f"using the etcd cluster at {self.external_etcd}")
        if self.make_generator is not None and not self.stop.is_set():
            self.supervisor.add(Part(GENERATOR, self._start_generator))
            self.supervisor.start(self.stop)
        if self.stop.is_set():
            return  # Ctrl-C while starting: leaving the block stops what started
        if self.before_dagster is not None:
            self.before_dagster(self)
        self._add_processes(before)
        self.supervisor.start(self.stop)
        if not self.stop.is_set():
            self._set_state("running")

    def _start_generator(self) -> Handle:
        assert self.make_generator is not None
        self.generator = self.make_generator()
        self.generator.start()
        say(f"generator writing into {self.generator.root}; {self.generator.describe()}")
        return GeneratorHandle(self.generator)

    def _add_processes(self, before: procs.StackRecord) -> None:
        """Spark Connect and the Dagster parts: adopt the live ones, start the others."""
        wanted = [SPARK, *(DAGSTER_PARTS if self.dagster else ())]
        alive = {p.name: p for p in before.parts if p.name != ETCD and p.alive()}
        unwanted = [p for name, p in alive.items() if name not in wanted]
        if unwanted:
            say(f"stopping {', '.join(p.name for p in unwanted)} (not wanted now)")
            procs.stop_all([procs.Target(p.pid, p.pgid) for p in unwanted], STOP_GRACE_S)
        in_use = {n: _port_of(p.address) for n, p in alive.items() if n in wanted and p.address}
        ports = procs.kept_ports(self.state_dir, {SPARK: 0, CODE: 0, WEB: self.ui_port}, in_use)
        self.spark_remote = f"sc://127.0.0.1:{ports[SPARK]}"
        parts = [spark_connect_part(self.state_dir, ports[SPARK])]
        if self.dagster:
            env = dagster_env(
                self.state_dir, self.etcd_endpoints, self.spark_remote, self.changelog
            )
            env["CDC_DAGSTER_CLUSTER_ID"] = self.cluster_id
            if not any(name in alive for name in DAGSTER_PARTS):
                prepare_instance(self.state_dir, env)
            parts += dagster_parts(self.state_dir, env, ports[CODE], ports[WEB])
            self.ui_url = f"http://127.0.0.1:{ports[WEB]}"
        for part in parts:
            self.supervisor.add(part)
            if part.name in alive:
                say(f"{part.name} still runs (pid {alive[part.name].pid}): adopted")
                self.supervisor.adopt(part.name, AdoptedHandle(alive[part.name]))
            else:
                say(f"starting {part.name} ...")

    # -------------------------------------------------------------- run, stop
    def supervise(self) -> None:
        """Restart parts that die until ``stop`` is set."""
        self.supervisor.run(self.stop)

    def shut_down(self) -> None:
        """Stop every part at once (and the private etcd), then clear the record."""
        if not self.supervisor.slots:
            return
        say("stopping " + ", ".join(self.supervisor.slots) + " ...")
        started = time.monotonic()
        self._set_state("stopping")
        self.supervisor.shutdown(STOP_GRACE_S)
        if not self.external_etcd:
            from cdc_dagster.metastore.private_etcd import stop_private_etcd

            stop_private_etcd(self.state_dir, timeout_s=1.0)  # endpoint.json, any stray
        procs.write_record(self.state_dir, procs.StackRecord())
        self.supervisor.slots.clear()
        say(f"stopped in {time.monotonic() - started:.1f}s")

    # -------------------------------------------------------------- record
    def _set_state(self, state: str) -> None:
        from dataclasses import replace

        self._me = replace(self._me, state=state)
        self._record()

    def _record(self) -> None:
        parts = []
        for name, slot in self.supervisor.slots.items():
            if slot.handle is None or not slot.handle.pid:
                continue
            target = slot.handle.target()
            parts.append(
                procs.Service(
                    name,
                    slot.handle.pid,
                    slot.part.log,
                    slot.part.address,
                    getattr(target, "pgid", 0),
                    procs.start_ticks(slot.handle.pid),
                    slot.state.value,
                    slot.restarts,
                )
            )
        left = tuple(s for s in self.supervisor.leftovers if s.alive())
        record = procs.StackRecord(self._me, self.kind, self.external_etcd, tuple(parts), left)
        procs.write_record(self.state_dir, record)


def _port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1].rstrip("/"))


# ------------------------------------------------------------------------------ commands
@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM, SIGINT or SIGHUP (also when started with SIGINT ignored:
    a background job of a script, nohup), so the parts are stopped, never orphaned; the
    previous handlers come back on the way out."""
    stop = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        if not stop.is_set():
            say(f"{signal.Signals(signum).name}: stopping everything ...")
        stop.set()

    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    before = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield stop
    finally:
        for sig, previous in before.items():
            signal.signal(sig, previous)


def serve(
    state_dir: Path,
    *,
    etcd: str | None,
    port: int = 0,
    dagster: bool = True,
    captures: Sequence[str] = DEMO_CAPTURES,
    cluster_id: str = "default",
) -> int:
    """``server start``: etcd, Spark Connect and Dagster, supervised, until stopped; the
    ``captures`` are registered (desired state) once Dagster runs their leases' renewals."""
    from cdc_dagster.services import workload

    try:
        with (
            stop_on_signals() as stop,
            Stack(
                state_dir,
                etcd=etcd,
                ui_port=port,
                dagster=dagster,
                stop=stop,
                cluster_id=cluster_id,
            ) as stack,
        ):
            if stop.is_set():
                return 0
            if stack.ui_url:
                say(f"Dagster UI at {stack.ui_url}")
            if captures:
                say(
                    workload.ensure_captures(
                        stack.etcd_endpoints, stack.state_dir, captures, cluster_id
                    )
                )
            say(
                "running in the foreground, restarting any part that dies; Ctrl-C (or "
                "`cdc-dagster server stop`) stops everything; `cdc-dagster server start "
                "--detach` runs it in the background"
            )
            stack.supervise()
    except AlreadyRunningError as exc:
        say(str(exc))
    return 0


def demo(
    state_dir: Path,
    *,
    tables: int = 6,
    port: int = 0,
    dagster: bool = True,
    captures: Sequence[str] = DEMO_CAPTURES,
) -> int:
    """``demo``: :func:`serve` plus the embedded generator and a changefeed into a Delta root."""
    from cdc_dagster.services import workload

    changelog = state_dir.resolve() / "changelog"
    lake = state_dir.resolve() / "lake"
    say(f"the embedded generator ({tables} bank tables) writes into {changelog}")
    with (
        stop_on_signals() as stop,
        Stack(
            state_dir,
            kind="demo",
            ui_port=port,
            dagster=dagster,
            changelog=changelog,
            generator=lambda: workload.GeneratorThread(changelog, tables),
            stop=stop,
            # Before Dagster starts, so the changefeed's assets are in the catalog it loads
            # (the captures' leases may lapse before the first runs: the owner heals them).
            before_dagster=lambda st: say(
                workload.ensure_demo_changefeed(
                    st.etcd_endpoints,
                    st.state_dir,
                    DEMO_CHANGEFEED,
                    lake,
                    captures,
                    changelog,
                    st.generator.start_ts,
                )
            ),
        ) as stack,
    ):
        if stop.is_set():
            return 0
        for line in workload.what_to_look_at(stack.ui_url, DEMO_CHANGEFEED, lake):
            say(line)
        stack.supervise()
    return 0


def start_detached(state_dir: Path, argv: Sequence[str], timeout_s: float = 600.0) -> int:
    """``server start --detach``: run ``argv`` (a foreground ``server start``) in its own
    session with its output in ``server.log``; return once it runs (0) or failed (1)."""
    state_dir = state_dir.resolve()
    record = procs.read_record(state_dir)
    if record.supervisor is not None and record.supervisor.alive():
        say(
            f"already running (supervisor pid {record.supervisor.pid}); `cdc-dagster server status`"
        )
        return 0
    state_dir.mkdir(parents=True, exist_ok=True)
    log = state_dir / SERVER_LOG
    with open(log, "ab") as out:
        offset = out.tell()
        proc = subprocess.Popen(
            [sys.executable, "-m", "cdc_dagster.cli", *argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        offset = _echo(log, offset)
        sup = procs.read_record(state_dir).supervisor
        if sup is not None and sup.pid == proc.pid and sup.state == "running":
            say(
                f"running in the background (supervisor pid {proc.pid}), output in {log}; "
                "`cdc-dagster server status` / `cdc-dagster server stop`"
            )
            return 0
        if proc.poll() is not None:
            _echo(log, offset)
            say(f"the server ended with exit code {proc.returncode}; see {log}")
            return 1
        time.sleep(0.3)
    say(
        f"the server did not come up within {timeout_s:.0f}s; it goes on in the background; see {log}"
    )
    return 1


def _echo(log: Path, offset: int) -> int:
    with open(log, "rb") as f:
        f.seek(offset)
        data = f.read()
    if data:
        sys.stdout.write(data.decode(errors="replace"))
        sys.stdout.flush()
    return offset + len(data)


def stop(state_dir: Path, grace_s: float = STOP_GRACE_S) -> None:
    """``server stop``: SIGTERM the supervisor, every recorded part's process group and the
    private etcd at once, SIGKILL what is left after ``grace_s``; then clear the record."""
    from cdc_dagster.metastore.private_etcd import stop_private_etcd

    state_dir = state_dir.resolve()
    started = time.monotonic()
    record = procs.read_record(state_dir)
    targets = _live_targets(record)
    etcd = threading.Thread(
        target=stop_private_etcd, args=(state_dir,), kwargs={"timeout_s": grace_s}
    )
    if not record.etcd:
        etcd.start()
    if targets:
        say("stopping " + ", ".join(f"{name} (pid {t.pid})" for name, t in targets) + " ...")
    killed = procs.stop_all([t for _, t in targets], grace_s=grace_s)
    if killed:
        names = [name for name, t in targets if t in killed]
        say(f"SIGKILLed after {grace_s:.1f}s: {', '.join(names)}")
    # A supervisor that relaunched a part as it was being stopped: that one too.
    late = _live_targets(procs.read_record(state_dir))
    procs.stop_all([t for _, t in late], grace_s=0.5)
    if not record.etcd:
        etcd.join()
    procs.write_record(state_dir, procs.StackRecord())
    say(f"stopped in {time.monotonic() - started:.1f}s" if targets else "nothing was running")


def _live_targets(record: procs.StackRecord) -> list[tuple[str, procs.Target]]:
    out = []
    if record.supervisor is not None and record.supervisor.alive():
        out.append(("supervisor", procs.Target(record.supervisor.pid)))  # its pid alone
    for part in record.parts:
        if part.name != ETCD and part.alive():
            out.append((part.name, procs.Target(part.pid, part.pgid)))
    out += [(s.name, procs.Target(s.pid)) for s in record.leftovers if s.alive()]
    return out


def status(state_dir: Path) -> tuple[list[str], int]:
    """``server status``: one line per part, and the exit code: 0 when every part runs,
    1 when one is down (the last line names which), 3 when nothing runs."""
    from cdc_dagster.metastore.private_etcd import private_etcd_status

    state_dir = state_dir.resolve()
    record = procs.read_record(state_dir)
    etcd = private_etcd_status(state_dir)
    sup = record.supervisor
    sup_alive = sup is not None and sup.alive()
    if not sup_alive and not any(p.alive() for p in record.parts) and not etcd.running:
        return [f"nothing runs for {state_dir}; start it with `cdc-dagster server start`"], 3
    lines, down = [], []
    if sup_alive:
        assert sup is not None
        lines.append(f"supervisor: running (pid {sup.pid}, {record.kind or 'server'})")
    else:
        down.append("supervisor")
        lines.append(
            "supervisor: not running, so nothing restarts a part that dies; "
            "`cdc-dagster server start` supervises the running parts again and starts the rest"
        )
    if record.etcd:
        lines.append(f"etcd: external cluster at {record.etcd} (not supervised here)")
    elif etcd.running:
        lines.append(f"etcd: running (pid {etcd.pid}) at {etcd.client_url}, {etcd.version}")
    else:
        down.append(ETCD)
        lines.append("etcd: not running")
    for part in record.parts:
        if part.name == ETCD:
            continue
        state = part_state(part)
        if state != "running":
            down.append(part.name)
        restarts = f", {part.restarts} restart(s)" if part.restarts else ""
        lines.append(f"{part.name}: {state} (pid {part.pid}{restarts}) {part.address}".rstrip())
    left = [s for s in record.leftovers if s.alive()]
    if left:
        pids = ", ".join(f"{s.pid} ({s.name})" for s in left)
        lines.append(f"still finishing, from parts that died: {pids}")
    if down:
        lines.append(f"down: {', '.join(down)}")
    return lines, 1 if down else 0


def part_state(part: procs.Service) -> str:
    """``running`` (alive and answering where it should), ``starting``, or ``dead``."""
    if not part.alive():
        return "dead"
    if part.name == ETCD:
        from cdc_dagster.metastore.etcd_process import is_healthy

        answers = is_healthy(part.address)
    elif part.address.startswith("http"):
        answers = procs.http_ok(f"{part.address}/server_info")
    else:
        answers = not part.address or procs.listening(_port_of(part.address))
    return "running" if answers else "starting"


def reload_definitions(state_dir: Path) -> str:
    """Make the Dagster of the stack running in ``state_dir`` load its definitions again, after
    a changefeed was created or removed (its assets and health check are built when the code
    server loads them; ``dagster api grpc`` loads once). The code server is killed and the
    supervisor starts it again on its port (runs in flight go on; the owner sensor misses a
    few ticks), and the webserver reloads the location when it sees the new server. Returns
    the line to show the user."""
    record = procs.read_record(state_dir)
    code = record.part(CODE)
    supervised = record.supervisor is not None and record.supervisor.alive()
    if not supervised or code is None or not code.alive():
        return (
            "its assets and health check appear in the Dagster UI once the code server loads "
            "the definitions again (restart it); the owner sensor replicates it meanwhile"
        )
    os.kill(code.pid, signal.SIGKILL)
    return (
        "restarting the Dagster code server so the UI shows its assets and health check "
        "(the owner sensor pauses for a few seconds)"
    )
