"""Test doubles and servers owned by a test: for tests and benchmarks only.

Production code never imports this package (``tests/unit/test_layers.py`` checks it):
``fake_runtime`` (a durable fake executor and a file-backed fake downstream),
``etcd`` (an etcd member owned by the test process), ``servers`` (private MariaDB and
PostgreSQL instances on free loopback ports).
"""
