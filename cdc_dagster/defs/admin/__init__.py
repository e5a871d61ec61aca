"""Admin jobs launchable from the UI (typed config, one-line errors, nothing half-done)."""
