"""scheduler_core is sans-I/O: importing all of it pulls in no dagster, pyspark or etcd client."""

from __future__ import annotations

import subprocess
import sys


def test_scheduler_core_imports_no_io_framework() -> None:
    code = (
        "import sys, pkgutil, importlib, scheduler_core\n"
        "for m in pkgutil.walk_packages(scheduler_core.__path__, 'scheduler_core.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = sorted({n.split('.')[0] for n in sys.modules}"
        " & {'dagster', 'pyspark', 'pyetcd', 'etcd3', 'grpc', 'socket_io', 'requests'})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
