"""Process supervision for the CLI: the private etcd, Spark Connect, `dagster dev`, the demo workload."""
