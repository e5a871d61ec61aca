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


def adopt_instance(payload: str) -> None:
    """``dagster api execute_run`` opens the run's instance from its ref: when that ref is
    the one opened ahead, it gets that instance (once), not a new one. Anything unexpected
    (another instance, a payload not read here): the run opens its own as before."""
    instance = _warm.pop("instance", None)
    if instance is None:
        return
    try:
        from dagster import DagsterInstance
        from dagster._grpc.types import ExecuteRunArgs
        from dagster._serdes import deserialize_value

        ref = deserialize_value(payload, ExecuteRunArgs).instance_ref
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
    """Preload ``argv``'s modules, then execute the run given on standard input."""
    base = lower_priority()
    restore_on_input(base)
    # the run's code module (the first) only: a preloaded library's ``warm_up`` is not ours
    line = preload(argv) + warm_up(argv[:1]) + warm_instance()
    say_ready()
    payload = sys.stdin.read()
    if not payload.strip():
        return 0  # retired before it got a run
    restore_priority(base)
    print(line, file=sys.stderr, flush=True)
    adopt_instance(payload.strip())
    from dagster._cli.api import execute_run_command

    # The CLI command itself (click), as `dagster api execute_run <args>` runs it: it loads
    # the run's job from its code origin, executes it and exits with its status.
    execute_run_command.main(args=[payload.strip()], prog_name="dagster api execute_run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
