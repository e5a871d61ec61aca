"""A warm run worker: ``dagster api execute_run`` with the code location already imported.

Started by :class:`cdc_dagster.services.run_launcher.WarmRunLauncher` before any run needs
it: it imports the modules named on its command line (the code location's module, which
imports Dagster, dagster-dbt, PySpark's client, ...: ~6 s on this machine), then waits on
its standard input. The launcher writes one run's ``ExecuteRunArgs`` there and closes it;
the worker then does exactly what ``dagster api execute_run`` does, and exits when the run
ends. End of input without a run (the launcher retired it, or its process died): it exits.

One run per worker, as Dagster's own run workers: a run never shares a process, so a run's
crash, leak or ``os._exit`` is its own. Done ahead: the imports, the code module's
``warm_up()`` (the dbt manifest's caches) and the instance (``warm_instance``: the run gets
it when its ref is the same); the definitions (``defs()``: the table catalog from etcd, the
dbt models) are built by the run, so they are as current as with a cold worker.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import resource
import select
import sys
import threading
import time
from pathlib import Path
from typing import Any

# The first line of a worker's output once its imports are done (the launcher's log shows
# how long they took); a module it could not import is named, and the run imports it again
# (and fails there, in its own event log, if it still cannot).
READY = "cdc-dagster run worker ready"
# ... and to the launcher: this byte on the pipe whose write end is the descriptor this
# variable names, once the imports are done (a run asked for ahead takes a worker done
# importing while another stays for a run that is awaited: run_launcher._Pool.take).
READY_FD_ENV = "CDC_DAGSTER_RUN_WORKER_READY_FD"
READY_BYTE = b"r"


# The CPU priority (niceness) of a worker's imports ahead of a run: a worker replacing one
# that just took a run imports for ~5 s of CPU, beside the runs already going (the captures'
# ticks); they come first. Its run gets the priority back. (Against processes of other
# sessions -- a snapshot's Spark readers, MariaDB -- a niceness does nothing under Linux's
# autogroup scheduling: two refills took 0.3-0.4 of the 2 cores here during a 10M-row
# snapshot's first reads at 10 and at 19 alike; hence the launcher's ``quiet_jobs``.)
PRELOAD_NICE = 10


def lower_priority() -> int | None:
    """Lower this process's priority to ``PRELOAD_NICE`` if it may be raised back for the
    run (root, or ``RLIMIT_NICE`` allows it); the niceness to go back to (None: unchanged)."""
    try:
        base = os.getpriority(os.PRIO_PROCESS, 0)
        soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
        allowed = os.geteuid() == 0 or soft == resource.RLIM_INFINITY or 20 - soft <= base
        if base >= PRELOAD_NICE or not allowed:
            return None
        os.setpriority(os.PRIO_PROCESS, 0, PRELOAD_NICE)
    except (OSError, ValueError):
        return None
    return base


def restore_priority(base: int | None) -> None:
    """Every thread of this process back to niceness ``base`` (Linux: a thread's own)."""
    if base is None:
        return
    tasks = Path("/proc/self/task")
    ids = [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]
    for tid in ids:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, base)


def preload(modules: list[str]) -> str:
    """Import ``modules``; a line saying how long it took and what failed."""
    started = time.monotonic()
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # the run reports it properly when it imports again
            failed.append(f"{name} ({type(exc).__name__}: {exc})")
    note = f"; not imported: {', '.join(failed)}" if failed else ""
    return f"{READY}: imported {', '.join(modules)} in {time.monotonic() - started:.1f} s{note}"


# The instance opened ahead (``warm_instance``), until a run takes it (``adopt_instance``)
_warm: dict[str, Any] = {}


def warm_up(modules: list[str]) -> str:
    """Each of ``modules``' ``warm_up()``, where it has one (work its runs repeat, done once
    ahead: ``cdc_dagster.defs.warm_up``); a failure leaves it to the run."""
    done = []
    for name in modules:
        fn = getattr(sys.modules.get(name), "warm_up", None)
        if not callable(fn):
            continue
        try:
            fn()
            done.append(name)
        except Exception:  # the run does it again and reports what fails
            continue
    return f"; warmed up {', '.join(done)}" if done else ""


def warm_instance() -> str:
    """Open the instance of ``DAGSTER_HOME`` (the one the launcher's runs use) ahead: its
    storage's modules (SQLAlchemy, Alembic, ...: ~0.8 s) imported, its storages made (0.2 s
    of a run's start under load); kept for the run (``adopt_instance``). Nothing is written
    (SQLite storages hold no connection between calls); a failure here is the run's to
    report."""
    import os

    if not os.environ.get("DAGSTER_HOME"):
        return ""
    started = time.monotonic()
    try:
        from dagster import DagsterInstance

        instance = DagsterInstance.get()
        instance.get_runs(limit=1)
        _warm["instance"] = instance
    except Exception as exc:
        return f"; instance not opened ahead ({type(exc).__name__}: {exc})"
    return f"; instance opened ahead in {time.monotonic() - started:.1f} s"


def run_args(payload: str) -> Any:
    """The run's ``ExecuteRunArgs`` read from the launcher's payload; None when it is not
    one (the run then reports it as ``dagster api execute_run`` does)."""
    try:
        from dagster._grpc.types import ExecuteRunArgs
        from dagster._serdes import deserialize_value

        return deserialize_value(payload, ExecuteRunArgs)
    except Exception:
        return None


def adopt_instance(args: Any) -> None:
    """``dagster api execute_run`` opens the run's instance from its ref: when that ref is
    the one opened ahead, it gets that instance (once), not a new one. Anything unexpected
    (another instance, a payload not read here: ``args`` None): the run opens its own as
    before."""
    instance = _warm.pop("instance", None)
    if instance is None:
        return
    from dagster import DagsterInstance

    ref = None if args is None else args.instance_ref
    try:
        same = ref is not None and ref == instance.get_ref()
    except Exception:
        same = False
    if not same:
        instance.dispose()
        return
    original = DagsterInstance.__dict__["from_ref"]

    def from_ref(instance_ref: Any) -> Any:
        DagsterInstance.from_ref = original  # once
        return instance if instance_ref == ref else original.__func__(instance_ref)

    DagsterInstance.from_ref = staticmethod(from_ref)  # type: ignore[method-assign]


def name_process(args: Any) -> None:
    """Name this process after its run's job (Linux: ``/proc/self/comm``, what ``top`` and
    ``ps -o comm`` show, at most 15 bytes): the run workers' command lines are all the same,
    so a machine's CPU can be told by job (``capture_tick``, ``mysql_puller``, ...) only
    this way. Anything unexpected (another system, a payload not read here): unnamed."""
    try:
        job = args.job_origin.job_name
        with open("/proc/self/comm", "w") as f:
            f.write(job.encode()[:15].decode(errors="ignore"))
    except Exception:
        pass


def restore_on_input(base: int | None) -> None:
    """Give the process its priority back as soon as its standard input has something (a
    run, or its end): a run handed to a worker still importing (the replacement of a worker
    taken a moment before) finishes those imports at the run's priority, not at the
    refill's, which under load left the run waiting behind every other process."""
    if base is None:
        return

    def wait() -> None:
        with contextlib.suppress(OSError, ValueError):
            select.select([sys.stdin], [], [])
        restore_priority(base)

    threading.Thread(target=wait, name="priority-on-run", daemon=True).start()


def say_ready() -> None:
    """Tell the launcher the imports are done (``READY_FD_ENV``; nothing without it)."""
    fd = os.environ.pop(READY_FD_ENV, "")
    if not fd.isdigit():
        return
    with contextlib.suppress(OSError):
        os.write(int(fd), READY_BYTE)
    with contextlib.suppress(OSError):
        os.close(int(fd))


def main(argv: list[str]) -> int:
    """Preload ``argv``'s modules, then execute the run given on standard input; with
    ``ZYGOTE_ARG`` first, preload them once and fork workers on request (:func:`zygote`)."""
    if argv[:1] == [ZYGOTE_ARG]:
        return zygote(argv[1:])
    base = lower_priority()
    restore_on_input(base)
    return serve(argv, base, preload(argv))


def serve(argv: list[str], base: int | None, line: str) -> int:
    """After the imports (``line`` says how they went): what is done ahead of a run, then
    the run given on standard input."""
    # the run's code module (the first) only: a preloaded library's ``warm_up`` is not ours
    line += warm_up(argv[:1]) + warm_instance()
    say_ready()
    payload = sys.stdin.read()
    if not payload.strip():
        return 0  # retired before it got a run
    restore_priority(base)
    args = run_args(payload.strip())
    name_process(args)
    print(line, file=sys.stderr, flush=True)
    adopt_instance(args)
    from dagster._cli.api import execute_run_command

    # The CLI command itself (click), as `dagster api execute_run <args>` runs it: it loads
    # the run's job from its code origin, executes it and exits with its status.
    execute_run_command.main(args=[payload.strip()], prog_name="dagster api execute_run")
    return 0


# -- the zygote: imports once, forks the workers ------------------------------------------
#
# A worker that imports for itself costs ~5.5 CPU-s (``cdc_dagster.defs``: Dagster,
# dagster-dbt and dbt-core, PySpark's client), and the launcher replaces each worker a run
# takes: two or three per capture rollover. Those imports fell into backlog drains and
# snapshot reads however the refills were timed (throughput bench). A zygote imports them
# once and forks each worker from itself: the fork shares the imported modules (copy on
# write) and is ready after the per-run work of ``serve`` (the code module's ``warm_up``, the
# instance: ~0.3 CPU-s). The zygote is the workers' parent, so it reaps them and tells the
# launcher each one's exit status.
ZYGOTE_ARG = "--zygote"
# The zygote's end of its socket (AF_UNIX, SOCK_SEQPACKET) to the launcher. The launcher
# sends FORK with two descriptors (the worker's standard input, the write end of its ready
# pipe) or QUIT (fork no more; exit once every worker forked has exited); the zygote sends
# READY once imported, "PID <pid>" for each FORK (0: refused), "EXIT <pid> <wait status>".
ZYGOTE_FD_ENV = "CDC_DAGSTER_RUN_ZYGOTE_FD"
FORK, QUIT, READY_MSG = b"F", b"Q", b"READY"
REAP_S = 0.2  # how often the zygote looks for workers that exited


def zygote(modules: list[str]) -> int:
    """Import ``modules`` (niced, as a worker would), then fork a worker for each FORK,
    reap them and report their exits, until the launcher's end closes (or QUIT, once no
    worker is left). Returns in a forked worker too: its exit code, once its run ended."""
    import socket

    sock = socket.socket(fileno=int(os.environ.pop(ZYGOTE_FD_ENV)))
    base = lower_priority()
    line = preload(modules)
    # the instance's storage modules imported here too (SQLAlchemy, Alembic: ~0.8 s); the
    # instance itself is opened by each worker (no connection crosses a fork)
    warm_instance()
    instance = _warm.pop("instance", None)
    if instance is not None:
        instance.dispose()
    try:
        sock.send(READY_MSG)
    except OSError:
        return 0  # the launcher ended while this imported
    workers: set[int] = set()
    quitting = False
    while not (quitting and not workers):
        readable = select.select([sock], [], [], REAP_S)[0]
        _reap(sock, workers)
        if not readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, 16, 2)
        except OSError:
            data, fds = b"", []
        if not data:
            return 0  # the launcher is gone: its workers go on, reaped by init
        if data == QUIT:
            quitting = True
        if data != FORK or len(fds) != 2 or quitting:
            for fd in fds:
                os.close(fd)
            if data != QUIT:
                with contextlib.suppress(OSError):
                    sock.send(b"PID 0")
            continue
        pid = os.fork()
        if pid == 0:
            return _forked(sock, fds, modules, base, line)
        for fd in fds:
            os.close(fd)
        workers.add(pid)
        with contextlib.suppress(OSError):  # the launcher gone: the next recv says so
            sock.send(f"PID {pid}".encode())
    return 0


def _reap(sock: Any, workers: set[int]) -> None:
    """Report each worker that exited (``EXIT <pid> <status>``)."""
    while workers:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            workers.clear()
            return
        if pid == 0:
            return
        workers.discard(pid)
        with contextlib.suppress(OSError):
            sock.send(f"EXIT {pid} {status}".encode())


def _forked(sock: Any, fds: list[int], modules: list[str], base: int | None, line: str) -> int:
    """In a worker just forked: its standard input and ready pipe from the launcher, the
    default signal handling, then ``serve`` as a worker that imported for itself."""
    import random
    import signal

    sock.close()
    stdin, ready = fds
    os.dup2(stdin, 0)
    os.close(stdin)
    os.environ[READY_FD_ENV] = str(ready)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Dagster's cancellation
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    random.seed()  # not the zygote's sequence in every worker
    restore_on_input(base)
    return serve(modules, base, f"{line}; forked from zygote pid {os.getppid()}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
