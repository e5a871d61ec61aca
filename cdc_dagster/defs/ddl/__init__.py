"""DDL runs: the gate check first, then the DDL applied at the sink."""
