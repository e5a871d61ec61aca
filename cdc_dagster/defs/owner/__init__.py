"""The owner loop as a Dagster sensor."""
