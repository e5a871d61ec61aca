"""Where a machine's CPU went, by the stack's roles: a sampler of ``/proc`` for the benches.

Every ``interval_s`` it reads each process's CPU time (``/proc/<pid>/stat``: user + system,
its threads included) and files the difference under the process's role: a run by its job
(the run workers name themselves after it: ``services.run_worker.name_process``), the
capture runs' bulk workers (``cdc bulk``), MariaDB, Spark's JVM and its Python workers,
the Dagster daemon, code server and webserver, etcd, sysbench, this process; the rest is
``other``. ``cores(t0, t1)`` gives each role's cores over a window of wall-clock time
(``time.time()``), ``line(...)`` the same as one line to print.

Reading ``/proc`` costs this process ~1-2 % of a core at the default interval, so the
benches start it only when asked (``--cpu-roles``): their figures are measured without it.
Linux only; elsewhere ``start`` does nothing and every window is empty.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter

# (a piece of the command line, the role), first match wins; a process whose name (comm)
# is a run's job name is that job's role before these are looked at
CMDLINE_ROLES = (
    ("mariadbd", "mariadb"),
    ("pyspark.daemon", "spark python"),
    ("pyspark.worker", "spark python"),
    ("org.apache.spark", "spark jvm"),
    ("dagster-daemon", "dagster daemon"),
    ("dagster api grpc", "code server"),
    ("dagster-webserver", "webserver"),
    ("cdc_dagster.services.run_worker", "idle run workers"),
    ("/etcd", "etcd"),
    ("sysbench", "sysbench"),
)
# names (comm) that are not a job's: a process still named after its program
PROGRAM_NAMES = ("python", "python3", "java", "bash", "sh", "etcd", "mariadbd", "sysbench")


def role_of(pid: int, comm: str, cmdline: str, own_pid: int) -> str:
    """The role of process ``pid`` named ``comm`` with command line ``cmdline``."""
    if pid == own_pid:
        return "bench"
    if comm == "cdc bulk":
        return "bulk workers"
    if comm and not comm.startswith(PROGRAM_NAMES) and ("run_worker" in cmdline):
        return comm  # a run, named after its job
    for piece, role in CMDLINE_ROLES:
        if piece in cmdline:
            return role
    return "other"


class CpuRoles:
    """A background sampler of ``/proc``: CPU seconds by role in each interval."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.samples: list[tuple[float, Counter[str]]] = []  # (end of interval, cpu-s by role)
        self._last: dict[int, float] = {}
        self._roles: dict[int, tuple[str, str]] = {}  # pid -> (comm it had, role)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def start(self) -> CpuRoles:
        if os.path.isdir("/proc/self") and self._thread is None:
            self._read()  # the first reading: the baseline of each process
            self._thread = threading.Thread(target=self._run, name="cpu-roles", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            used = self._read()
            self.samples.append((time.time(), used))

    def _read(self) -> Counter[str]:
        used: Counter[str] = Counter()
        seen: dict[int, float] = {}
        own = os.getpid()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    stat = f.read().decode(errors="replace")
            except OSError:
                continue  # gone
            comm = stat[stat.find("(") + 1 : stat.rfind(")")]
            fields = stat[stat.rfind(")") + 2 :].split()
            cpu = (int(fields[11]) + int(fields[12])) / self._tick
            seen[pid] = cpu
            role = self._role(pid, comm, own)
            # a process first seen now: what it used before this interval is not counted
            used[role] += cpu - self._last.get(pid, cpu)
        self._last = seen
        return used

    def _role(self, pid: int, comm: str, own: int) -> str:
        known = self._roles.get(pid)
        if known is not None and known[0] == comm:
            return known[1]
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmdline = ""
        role = role_of(pid, comm, cmdline, own)
        self._roles[pid] = (comm, role)
        return role

    def cores(self, t0: float, t1: float) -> dict[str, float]:
        """Each role's cores on average between wall-clock times ``t0`` and ``t1`` (the
        intervals that ended in it), the biggest first; empty when nothing was sampled."""
        span = t1 - t0
        got: Counter[str] = Counter()
        for end, used in list(self.samples):
            if t0 < end <= t1 + self.interval_s / 2:
                got.update(used)
        if span <= 0 or not got:
            return {}
        return {r: v / span for r, v in got.most_common() if v / span >= 0.005}

    def line(self, t0: float, t1: float) -> str:
        """``cores(t0, t1)`` as ``role 0.00, ...`` with the total first."""
        cores = self.cores(t0, t1)
        if not cores:
            return "not sampled"
        parts = ", ".join(f"{r} {v:.2f}" for r, v in cores.items())
        return f"{sum(cores.values()):.2f} cores: {parts}"
