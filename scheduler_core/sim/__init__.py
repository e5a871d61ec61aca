"""In-memory stand-ins for the data plane and the cluster, for the simulator and tests."""
