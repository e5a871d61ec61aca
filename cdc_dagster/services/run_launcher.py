"""A run launcher that keeps run workers warm: a run starts in ~1 s instead of ~6-30 s.

Dagster's default launcher asks the code server to start each run, and the code server
spawns a fresh interpreter that imports the whole code location before the run's first op:
~6 s on an idle 2-core machine for this project (Dagster 2 s, dagster-dbt and dbt 3.8 s),
and 10-35 s under load. Every capture run, binlog puller run, snapshot and DDL run paid it
on the replication path (a resume, a snapshot, a capture's next run after a fault).

:class:`WarmRunLauncher` (``run_launcher`` in the ``dagster.yaml`` that ``server start`` /
``demo`` write) starts run workers itself, from the process that launches runs (the
daemon), ahead of need: each is :mod:`cdc_dagster.services.run_worker` with the run's code
module already imported, waiting for a run. A launch hands the run to a warm worker and
starts another one (later while a run of a ``quiet_jobs`` job is going: below); with none
ready (the first run of a code location, a burst larger than the pool, a Python other than
the launcher's) it starts ``dagster api execute_run`` as the Docker and Kubernetes
launchers do. A worker says when its imports are done (a
byte on a pipe: ``run_worker.READY_FD_ENV``). A run takes the worker started longest ago of
those done importing (else the longest started: under load a replacement's imports take
15-20 s); a lane's next run, launched ahead of its need (``AHEAD_TAG``: a capture's or a
binlog puller's successor, which waits for the run it follows), takes the newest done while
another done stays for an awaited run, else the newest: when two captures' successors took
the pool just before a changefeed was created, its puller and snapshot runs waited 13-14 s
each for replacements' imports. (Taking the newest whatever its state, the second of two
captures' successors launched together got the replacement the first one's launch had just
started: under a 60-s sysbench load its imports took 20 s, so it started after its
predecessor's time was up, and a backlog arriving then waited for that handover: a drain
of 134k row changes readable in 11.3 s instead of 4-5, throughput bench.) A worker executes one run and exits, as Dagster's own
run workers: runs never share a process. Only imports are done ahead; the run builds the
definitions itself (the table catalog, the dbt manifest). A warm worker whose package
sources changed since it started (an edited or reinstalled project) is retired unused.

A replacement imports for ~5 CPU-seconds. Started at once, it took that from a snapshot's
chunk reads launched with it (a ``mysql_snapshot`` run and its changefeed's puller take the
two warm workers at once): on 2 cores, during the first 20 s of a 10M-row snapshot, the two
refills ran at ~0.35 core and the upstream and the readers got a third less, which the
stream's captures did not give up. So the pool is refilled only once no run of
``quiet_jobs`` is starting or started, or ``quiet_max_s`` after the launch (a long snapshot
does not keep the pool empty for good); a launch meanwhile with no warm worker left starts
cold. Likewise while fewer than ``quiet_idle_cores`` of the machine's CPUs were idle over
the last second: a replacement's niceness counts only within the daemon's session (Linux's
autogroups), so the two replacements of two captures' next runs took 8.6 CPU-s of the
10.3 s a backlog drain arriving with them lasted (readable after 10.3 s instead of
3.4-4.1: the capture's bulk workers and the puller got the rest; throughput bench).

Those waits did not settle it (throughput bench, twenty-sixth session): refills that waited
for a quiet moment left the next launches cold during a snapshot's slices (~10 CPU-s each);
refills that took the first idle second took 11 of a backlog drain's 25 CPU-s. So by default
(``fork_workers``) the workers are forked from a *zygote* (``run_worker --zygote``: one
process per pool key that imported the modules once, started at the key's first refill and
again when its sources change): a forked worker is ready after ~0.2 CPU-s (the code module's
``warm_up``, the instance), and the pool is refilled at once, without the waits above, which
serve only workers that import for themselves. A launch that finds no worker idle (the
first runs after the daemon started, a burst larger than the pool) has one forked for it,
the zygote started and waited for if need be (at most ``ZYGOTE_LAUNCH_WAIT_S``): at a new
changefeed's first evaluation, four cold starts (~10 CPU-s each, side by side) became one
zygote's imports. The zygote is the workers' parent: it reaps
them and tells the launcher their exit statuses (``_Forked``); a zygote that died is
replaced at the next refill, and its workers' runs go on (their exit statuses unknown).

Around the process it owns, the launcher also:

- watches it: a worker that exits before its run ended (killed, out of memory) marks the
  run failed with the exit code or signal (canceled if it was being canceled);
- terminates it: ``terminate`` sends SIGINT (Dagster's own cancellation: the run stops at
  its next step boundary or interruptible call and is marked canceled) and SIGKILL
  ``kill_after_s`` later if the process is still there, even if it is frozen (SIGSTOP);
- answers run monitoring: the worker's pid (and its start time, against pid reuse) is the
  run's ``cdc/run_worker`` tag, so a daemon restarted after the launch still sees whether
  the worker lives.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from dagster import BoolSource, Field, IntSource, Noneable
from dagster import _check as check
from dagster._core.launcher.base import (
    CheckRunHealthResult,
    LaunchRunContext,
    RunLauncher,
    WorkerStatus,
)
from dagster._serdes import ConfigurableClass, ConfigurableClassData

from cdc_dagster.pipeline.background import wait_for_idle_cpus
from cdc_dagster.services.run_worker import (
    FORK,
    QUIT,
    READY_BYTE,
    READY_FD_ENV,
    READY_MSG,
    ZYGOTE_ARG,
    ZYGOTE_FD_ENV,
)

WORKER_TAG = "cdc/run_worker"  # "<pid>:<start time>" of the process executing the run
# A lane's next run, requested before the run it follows ends (cdc_dagster/defs/handoff.py,
# its own copy of the name): it gets the newest warm worker.
AHEAD_TAG = "cdc/ahead"
DEFAULT_WARM_WORKERS = 3  # see the dagster.yaml `server start` writes (services/dagster_home.py)
DEFAULT_KILL_AFTER_S = 30
DEFAULT_QUIET_MAX_S = 120  # a refill waits at most this long for the quiet_jobs' runs
DEFAULT_QUIET_IDLE_CORES = 0.0  # ... and for this many idle CPUs (0: does not look)
QUIET_POLL_S = 1.0  # ... looking this often whether one is still going
FINGERPRINT_TTL_S = 1.0  # package sources are looked at most once a second
ZYGOTE_READY_S = 120.0  # a refill waits at most this long for a zygote's imports
ZYGOTE_LAUNCH_WAIT_S = 30.0  # ... a launch with no worker idle (then it starts cold)
FORK_REPLY_S = 10.0  # ... and this long for its answer to a fork
# A forked worker's exit status when its zygote ended first (nobody left to tell it)
UNKNOWN_EXIT = -1000


@dataclass
class _Warm:
    """A started worker waiting for a run, and what it imported. ``ready_fd``: the read end
    of the pipe on which the worker says its imports are done (``READY_FD_ENV``)."""

    proc: subprocess.Popen | _Forked
    fingerprint: tuple[int, int]
    ready_fd: int | None = None
    forked: bool = False  # from a zygote (``_Zygote``), not importing for itself
    for_run: bool = False  # forked for a run that found no worker idle (``_Pool.fork_now``)
    started: float = field(default_factory=time.monotonic)
    done_importing: bool = False

    def ready(self) -> bool:
        """Whether the worker said its imports are done (looked at without waiting)."""
        if not self.done_importing and self.ready_fd is not None:
            try:
                said = os.read(self.ready_fd, 1)
            except BlockingIOError:
                return False
            except OSError:
                said = b""
            self.done_importing = said == READY_BYTE
            self.forget_ready()  # said it, or closed the pipe without (it died: not ready)
        return self.done_importing

    def forget_ready(self) -> None:
        if self.ready_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.ready_fd)
            self.ready_fd = None


class _Forked:
    """A worker forked by a :class:`_Zygote`: what the launcher uses of a ``Popen`` (its
    pid, standard input, ``poll``, ``wait``). Not the launcher's child: its exit status comes
    from the zygote (``UNKNOWN_EXIT`` if the zygote ended before it)."""

    def __init__(self, pid: int, stdin: Any, zygote: _Zygote) -> None:
        self.pid = pid
        self.stdin = stdin
        self.zygote = zygote
        self.start_time = worker_start_time(pid)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            status = self.zygote.exit_status(self.pid)
            if status is not None:
                self.returncode = os.waitstatus_to_exitcode(status)
            elif self.zygote.ended and not worker_alive(f"{self.pid}:{self.start_time}"):
                self.returncode = UNKNOWN_EXIT
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired([f"worker {self.pid}"], timeout or 0.0)
            self.zygote.wait_for_exits(0.5)
        assert self.returncode is not None
        return self.returncode


class _Zygote:
    """``run_worker --zygote``: imports a pool key's modules once, then forks workers (see
    ``run_worker.zygote``). Started niced as a worker; a reader thread takes its messages."""

    def __init__(self, key: PoolKey, fingerprint: tuple[int, int]) -> None:
        self.fingerprint = fingerprint
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [key.python, "-m", "cdc_dagster.services.run_worker", ZYGOTE_ARG, *key.modules],
                stdin=subprocess.DEVNULL,
                close_fds=True,
                pass_fds=(theirs.fileno(),),
                env={**os.environ, ZYGOTE_FD_ENV: str(theirs.fileno())},
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self.ready = threading.Event()
        self.ended = False
        self._replies: queue.Queue[int] = queue.Queue()
        self._exits: dict[int, int] = {}
        self._exited = threading.Condition()
        self._fork_lock = threading.Lock()
        threading.Thread(target=self._read, name="run-zygote", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                msg = self.sock.recv(256)
            except OSError:
                msg = b""
            if not msg:
                break
            if msg == READY_MSG:
                self.ready.set()
            elif msg.startswith(b"PID "):
                self._replies.put(int(msg.split()[1]))
            elif msg.startswith(b"EXIT "):
                _, pid, status = msg.split()
                with self._exited:
                    self._exits[int(pid)] = int(status)
                    self._exited.notify_all()
        with self._exited:
            self.ended = True
            self._exited.notify_all()
        with contextlib.suppress(OSError):
            self.sock.close()
        self.ready.set()  # wakes a refill waiting for it: it sees the zygote ended
        self._replies.put(0)
        threading.Thread(target=self.proc.wait, daemon=True).start()  # reaped

    def usable(self) -> bool:
        return self.ready.is_set() and not self.ended

    def exit_status(self, pid: int) -> int | None:
        with self._exited:
            return self._exits.pop(pid, None)

    def wait_for_exits(self, timeout: float) -> None:
        with self._exited:
            if not self.ended:
                self._exited.wait(timeout)
            else:
                time.sleep(timeout)  # nobody will tell: the caller looks at the process

    def fork(self, for_run: bool = False) -> _Warm | None:
        """A new worker, in the pool's terms (None: the zygote refused or did not answer
        within ``FORK_REPLY_S``; it is then retired); ``for_run``: for a run that found no
        worker idle."""
        stdin_r, stdin_w = os.pipe()
        ready_r, ready_w = os.pipe()
        with self._fork_lock:
            try:
                socket.send_fds(self.sock, [FORK], [stdin_r, ready_w])
                pid = self._replies.get(timeout=FORK_REPLY_S)
            except (OSError, queue.Empty):
                pid = 0
            finally:
                os.close(stdin_r)
                os.close(ready_w)
        if pid <= 0:
            os.close(stdin_w)
            os.close(ready_r)
            self.retire()
            return None
        os.set_blocking(ready_r, False)
        proc = _Forked(pid, os.fdopen(stdin_w, "wb"), self)
        return _Warm(proc, self.fingerprint, ready_r, forked=True, for_run=for_run)

    def retire(self) -> None:
        """Fork no more; the zygote exits once its workers did (their exits still told)."""
        with contextlib.suppress(OSError):
            self.sock.send(QUIT)

    def close(self) -> None:
        """End the zygote now (its workers go on; their exits are no longer told)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


def _stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name ([] where unknown)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def worker_start_time(pid: int) -> str:
    """The process's start time (clock ticks since boot, from /proc) or "" where unknown:
    tells a pid reused by another process from the worker's."""
    fields = _stat(pid)
    return fields[19] if len(fields) > 19 else ""


def worker_alive(tag: str) -> bool:
    """Whether the process a ``cdc/run_worker`` tag names is still the run's worker."""
    pid_text, _, start = tag.partition(":")
    try:
        pid = int(pid_text)
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    fields = _stat(pid)
    if start and (len(fields) <= 19 or fields[19] != start):
        return False
    return not fields or fields[0] != "Z"  # a zombie has exited


def exit_text(returncode: int) -> str:
    """``exited with code N`` / ``was killed by SIGKILL``."""
    if returncode == UNKNOWN_EXIT:
        return "ended (its exit status is unknown: the zygote it was forked from ended first)"
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def package_fingerprint(modules: Sequence[str], where: str = "") -> tuple[int, int]:
    """(number of .py files, newest mtime in ns) of the top-level packages of ``modules``,
    found without importing them (in ``where``, then ``sys.path``): changes when the
    project's sources do."""
    count = newest = 0
    path = [where, *sys.path] if where else None
    for top in sorted({m.split(".")[0] for m in modules}):
        spec = importlib.machinery.PathFinder.find_spec(top, path)
        if spec is None:
            continue
        roots = list(spec.submodule_search_locations or ())
        files = [spec.origin] if not roots and spec.origin else []
        for root in roots:
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = [d for d in dirnames if d != "__pycache__"]
                files += [os.path.join(dirpath, f) for f in filenames if f.endswith(".py")]
        count += len(files)
        newest = max([newest, *(_mtime(f) for f in files)])
    return count, newest


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


class PoolKey(NamedTuple):
    """Which runs a warm worker can take: its Python, the modules it imports, and the code
    location's working directory (where its modules are looked for first)."""

    python: str
    modules: tuple[str, ...]
    where: str


class _Pool:
    """Warm workers per (python, modules to import), forked from a zygote of that key when
    ``fork`` (else each imports for itself); thread-safe (the daemon launches from several
    threads)."""

    def __init__(self, size: int, fork: bool = True) -> None:
        self.size = size
        self.fork = fork
        self.lock = threading.Lock()
        self.idle: dict[PoolKey, list[_Warm]] = {}
        self.fingerprints: dict[PoolKey, tuple[float, tuple[int, int]]] = {}
        self.zygotes: dict[PoolKey, _Zygote] = {}

    def zygote(self, key: PoolKey) -> _Zygote | None:
        """The zygote of ``key`` and its current sources, started if there is none (or the
        sources changed: the old one is retired); None when not forking or it cannot start."""
        if not self.fork or self.size <= 0:
            return None
        fp = self.fingerprint(key)
        with self.lock:
            z = self.zygotes.get(key)
            if z is not None and (z.ended or z.fingerprint != fp):
                z.retire()
                z = None
            if z is None:
                try:
                    z = self.zygotes[key] = _Zygote(key, fp)
                except OSError:
                    self.zygotes.pop(key, None)
                    return None
            return z

    def fork_now(self, key: PoolKey) -> _Warm | None:
        """A worker forked at once for a run that found none idle (a burst, the first runs
        after the daemon started: four runs at a changefeed's first evaluation): from the
        key's zygote, started if there is none and waited for at most ``ZYGOTE_LAUNCH_WAIT_S``
        (its imports, ~5.5 CPU-s once, instead of ~10 for each cold start beside the
        others). None when not forking, or the zygote cannot fork."""
        z = self.zygote(key)
        if z is None or not z.ready.wait(ZYGOTE_LAUNCH_WAIT_S) or not z.usable():
            return None
        return z.fork(for_run=True)

    def _new_worker(self, key: PoolKey, fp: tuple[int, int]) -> _Warm:
        """A worker forked from ``key``'s zygote when it is ready and of ``fp`` (else one
        importing for itself)."""
        z = self.zygotes.get(key)
        forked = z.fork() if z is not None and z.usable() and z.fingerprint == fp else None
        return forked or _start_worker(key, fp)

    def fingerprint(self, key: PoolKey) -> tuple[int, int]:
        now = time.monotonic()
        with self.lock:
            seen = self.fingerprints.get(key)
        if seen is not None and now - seen[0] < FINGERPRINT_TTL_S:
            return seen[1]
        fp = package_fingerprint(key.modules, key.where)
        with self.lock:
            self.fingerprints[key] = (now, fp)
        return fp

    def take(self, key: PoolKey, newest: bool = False) -> _Warm | None:
        """A live worker of ``key`` that imported the current sources (stale or dead ones
        retired): for a run that is awaited, the longest started of those done importing
        (else the longest started: the likeliest done next); for a run asked for ahead
        (``newest``), the newest done importing while another done stays for an awaited
        run, else the newest (maybe still importing: that run has time to wait)."""
        current = self.fingerprint(key)
        with self.lock:
            workers = self.idle.get(key, [])
            _retire_stale(workers, current)
            if not workers:
                return None
            done = [w for w in workers if w.ready()]
            if newest:
                w = done[-1] if len(done) > 1 else workers[-1]
            else:
                w = done[0] if done else workers[0]
            workers.remove(w)
            w.forget_ready()
            return w

    def refill(self, key: PoolKey) -> None:
        """Start workers until ``size`` of ``key`` are idle."""
        fp = self.fingerprint(key)
        with self.lock:
            workers = self.idle.setdefault(key, [])
            _retire_stale(workers, fp)
            while len(workers) < self.size:  # under the lock: two refills start no extra
                workers.append(self._new_worker(key, fp))

    def close(self) -> None:
        with self.lock:
            workers = [w for ws in self.idle.values() for w in ws]
            self.idle.clear()
            zygotes = list(self.zygotes.values())
            self.zygotes.clear()
        for w in workers:
            _retire(w)
        for z in zygotes:
            z.close()


def _start_worker(key: PoolKey, fingerprint: tuple[int, int]) -> _Warm:
    """A worker importing ``key``'s modules; it writes ``READY_BYTE`` on a pipe of its own
    once done (``_Warm.ready``)."""
    read_end, write_end = os.pipe()
    try:
        os.set_blocking(read_end, False)
        proc = subprocess.Popen(
            [key.python, "-m", "cdc_dagster.services.run_worker", *key.modules],
            stdin=subprocess.PIPE,
            close_fds=True,
            pass_fds=(write_end,),
            env={**os.environ, READY_FD_ENV: str(write_end)},
        )
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return _Warm(proc, fingerprint, read_end)


def _cold_command(origin: Any, args: Any) -> list[str]:
    """``dagster api execute_run`` of the code location's Python (its entry point when the
    code server gave one; else ``<python> -m dagster``, not a ``dagster`` found on PATH)."""
    from dagster._serdes import serialize_value

    repo = origin.repository_origin
    entry = list(repo.entry_point or ()) or [repo.executable_path, "-m", "dagster"]
    if entry == ["dagster"]:  # Dagster's default when the origin names none
        entry = [repo.executable_path, "-m", "dagster"]
    return [*entry, "api", "execute_run", serialize_value(args)]


def _retire_stale(workers: list[_Warm], fingerprint: tuple[int, int]) -> None:
    """Take out of ``workers`` (and retire) those that died or imported other sources."""
    for w in [w for w in workers if w.proc.poll() is not None or w.fingerprint != fingerprint]:
        workers.remove(w)
        _retire(w)


def _retire(w: _Warm) -> None:
    """End an idle worker (end of its input: it exits without a run); reaped in a thread."""
    w.forget_ready()
    try:
        if w.proc.stdin is not None:
            w.proc.stdin.close()
    except OSError:
        pass
    threading.Thread(target=w.proc.wait, daemon=True).start()


class WarmRunLauncher(RunLauncher, ConfigurableClass):
    """Launches each run in a run worker of its own that imported the code location ahead
    of the launch (see the module docstring)."""

    def __init__(
        self,
        inst_data: ConfigurableClassData | None = None,
        warm_workers: int = DEFAULT_WARM_WORKERS,
        kill_after_s: int = DEFAULT_KILL_AFTER_S,
        preload_modules: Sequence[str] | None = None,
        quiet_jobs: Sequence[str] | None = None,
        quiet_max_s: float = DEFAULT_QUIET_MAX_S,
        quiet_idle_cores: float = DEFAULT_QUIET_IDLE_CORES,
        fork_workers: bool = True,
    ) -> None:
        self._inst_data = inst_data
        self.warm_workers = check.int_param(warm_workers, "warm_workers")
        self.kill_after_s = kill_after_s
        self.preload_modules = tuple(preload_modules or ())
        self.quiet_jobs = tuple(quiet_jobs or ())
        self.quiet_max_s = float(quiet_max_s)
        self.quiet_idle_cores = float(quiet_idle_cores)
        self.fork_workers = bool(fork_workers)
        self._pool = _Pool(max(self.warm_workers, 0), fork=self.fork_workers)
        self._procs: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict[str, Field]:
        return {
            "warm_workers": Field(
                IntSource,
                default_value=DEFAULT_WARM_WORKERS,
                description="Run workers kept ready per code location (0: none, every run "
                "starts cold as with `dagster api execute_run`).",
            ),
            "kill_after_s": Field(
                IntSource,
                default_value=DEFAULT_KILL_AFTER_S,
                description="Seconds between a termination request (SIGINT) and SIGKILL.",
            ),
            "preload_modules": Field(
                Noneable([str]),
                default_value=None,
                description="Modules a warm worker imports besides the run's code module.",
            ),
            "quiet_jobs": Field(
                Noneable([str]),
                default_value=None,
                description="Jobs whose runs the pool's refill waits for (it starts once none "
                "is starting or started, or quiet_max_s after the launch): their work gets the "
                "CPU the replacement workers' imports would take.",
            ),
            "quiet_max_s": Field(
                float,
                default_value=float(DEFAULT_QUIET_MAX_S),
                description="Seconds a refill waits at most for the quiet_jobs' runs.",
            ),
            "quiet_idle_cores": Field(
                float,
                default_value=DEFAULT_QUIET_IDLE_CORES,
                description="A refill also waits (at most quiet_max_s) while fewer CPUs than "
                "this were idle over the last second (0: it does not look; Linux's /proc/stat).",
            ),
            "fork_workers": Field(
                BoolSource,
                default_value=True,
                description="Fork the warm workers from one process that imported the code "
                "location once (a zygote: ~0.3 CPU-s a worker instead of ~5.5, and no wait "
                "for quiet_jobs or idle CPUs); false: each worker imports for itself.",
            ),
        }

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]
    ) -> WarmRunLauncher:
        return cls(inst_data=inst_data, **config_value)

    # -- launching ---------------------------------------------------------------------

    def _pool_key(self, origin: Any) -> PoolKey | None:
        """Which warm workers can take a run of ``origin``: the launcher's own Python, the
        origin's code module; None when only a cold start can (another Python, a file)."""
        repo = origin.repository_origin
        module = getattr(repo.code_pointer, "module", None)
        if self.warm_workers <= 0 or not module:
            return None
        if os.path.abspath(repo.executable_path) != os.path.abspath(sys.executable):
            return None
        where = getattr(repo.code_pointer, "working_directory", None) or ""
        return PoolKey(sys.executable, (module, *self.preload_modules), where)

    def launch_run(self, context: LaunchRunContext) -> None:
        from dagster._core.events import EngineEventData
        from dagster._grpc.types import ExecuteRunArgs
        from dagster._serdes import serialize_value

        run = context.dagster_run
        origin = check.not_none(run.job_code_origin, "the run has no code origin")
        args = ExecuteRunArgs(
            job_origin=origin,
            run_id=run.run_id,
            instance_ref=self._instance.get_ref(),
            set_exit_code_on_failure=True,
        )
        key = self._pool_key(origin)
        proc, how = None, "cold: `dagster api execute_run`, no warm worker"
        # a lane's next run, launched ahead of its need, takes the newest worker (maybe
        # still importing): the readiest stay for the runs that are awaited
        ahead = run.tags.get(AHEAD_TAG) == "1"
        warm = self._pool.take(key, newest=ahead) if key else None
        if warm is None and key is not None:  # none idle: forked for it, not cold
            warm = self._pool.fork_now(key)
        if warm is not None:
            try:
                assert warm.proc.stdin is not None
                warm.proc.stdin.write(serialize_value(args).encode())
                warm.proc.stdin.close()
                proc = warm.proc
                ago = time.monotonic() - warm.started
                how = (
                    f"warm: {'forked' if warm.forked else 'started'} {ago:.0f} s before the run"
                    if not warm.for_run
                    else "warm: forked for it from the zygote, no worker was idle"
                )
            except OSError:  # died meanwhile: a cold one
                _retire(warm)
        if proc is None:
            proc = subprocess.Popen(_cold_command(origin, args), stdin=subprocess.DEVNULL)
        tag = f"{proc.pid}:{worker_start_time(proc.pid)}"
        self._instance.add_run_tags(run.run_id, {WORKER_TAG: tag})
        self._instance.report_engine_event(
            f"Run worker pid {proc.pid} ({how}).",
            run,
            EngineEventData.in_process(proc.pid),
        )
        with self._lock:
            self._procs[run.run_id] = proc
        threading.Thread(target=self._watch, args=(run.run_id, proc), daemon=True).start()
        if key:
            threading.Thread(target=self._refill, args=(key,), daemon=True).start()

    def _refill(self, key: PoolKey) -> None:
        """Refill the pool: at once with workers forked from the key's zygote (started
        here the first time, or when the sources changed; its imports waited for, at most
        ``ZYGOTE_READY_S``). Workers that import for themselves (no zygote) wait until no
        ``quiet_jobs`` run is going and ``quiet_idle_cores`` CPUs were idle over the last look
        (``QUIET_POLL_S``), or ``quiet_max_s`` passed. One look, not the bulk workers'
        ``background.IDLE_STEADY_S``: tried for refills, it showed no gain, and a refill that
        does not come leaves the next launch cold (~10 CPU-s, twice a refill's imports, on
        the run's way to its work: throughput bench)."""
        z = self._pool.zygote(key)
        if z is not None and z.ready.wait(ZYGOTE_READY_S) and not z.ended:
            self._pool.refill(key)
            return
        wait_for_idle_cpus(self.quiet_idle_cores, self.quiet_max_s, self._quiet_run_going,
                           QUIET_POLL_S, steady_s=QUIET_POLL_S)  # fmt: skip
        self._pool.refill(key)

    def _quiet_run_going(self) -> bool:
        """Whether a run of a ``quiet_jobs`` job is starting or started (a storage that
        does not answer: no, the refill goes ahead)."""
        if not self.quiet_jobs:
            return False
        from dagster import DagsterRunStatus, RunsFilter

        statuses = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]
        try:
            return any(
                self._instance.get_runs_count(RunsFilter(job_name=job, statuses=statuses)) > 0
                for job in self.quiet_jobs
            )
        except Exception:  # the refill is an optimisation: never held by a storage error
            return False

    def _watch(self, run_id: str, proc: subprocess.Popen) -> None:
        """When the worker exits, a run it left unfinished is failed (or canceled)."""
        code = proc.wait()
        with self._lock:
            self._procs.pop(run_id, None)
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return
        why = f"run worker pid {proc.pid} {exit_text(code)} before the run ended"
        from dagster import DagsterRunStatus

        if run.status == DagsterRunStatus.CANCELING:
            self._instance.report_run_canceled(run, f"Canceled: {why}.")
        else:
            self._instance.report_run_failed(run, f"{why[0].upper()}{why[1:]}.")

    # -- termination and health ---------------------------------------------------------

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        self._instance.report_run_canceling(run)
        tag = run.tags.get(WORKER_TAG, "")
        if not tag or not worker_alive(tag):
            self._instance.report_run_canceled(run, "Canceled: its run worker is not running.")
            return True
        pid = int(tag.split(":")[0])
        try:
            os.kill(pid, signal.SIGINT)  # Dagster's cancellation: interrupts the run
        except ProcessLookupError:
            return True
        threading.Thread(target=self._kill_later, args=(run_id, tag), daemon=True).start()
        return True

    def _kill_later(self, run_id: str, tag: str) -> None:
        deadline = time.monotonic() + self.kill_after_s
        while time.monotonic() < deadline:
            if not worker_alive(tag):
                return
            time.sleep(0.5)
        pid = int(tag.split(":")[0])
        try:
            os.kill(pid, signal.SIGKILL)  # also a frozen (SIGSTOP) process
        except ProcessLookupError:
            return
        run = self._instance.get_run_by_id(run_id)
        if run is not None and not run.is_finished:
            self._instance.report_run_canceled(
                run,
                f"Canceled: run worker pid {pid} did not stop within {self.kill_after_s} s of "
                "the termination request and was killed (SIGKILL).",
            )

    def kill_worker(self, run: Any) -> str:
        """SIGKILL the run's worker at once (a run that ignored its termination: frozen or
        hung); what happened, for the log ("" when no worker of it runs)."""
        tag = run.tags.get(WORKER_TAG, "")
        if not tag or not worker_alive(tag):
            return ""
        pid = int(tag.split(":")[0])
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return ""
        return f"run worker pid {pid} killed (SIGKILL)"

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: Any) -> CheckRunHealthResult:
        tag = run.tags.get(WORKER_TAG, "")
        if not tag:
            return CheckRunHealthResult(WorkerStatus.NOT_FOUND, "no run worker was started")
        if worker_alive(tag):
            return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=tag)
        return CheckRunHealthResult(
            WorkerStatus.FAILED, f"run worker pid {tag.split(':')[0]} is gone", run_worker_id=tag
        )

    def join(self, timeout: int = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                procs = list(self._procs.values())
            if not procs:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"run workers still running: {[p.pid for p in procs]}")
            time.sleep(0.05)

    def dispose(self) -> None:
        self._pool.close()
