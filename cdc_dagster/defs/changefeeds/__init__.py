"""Changefeeds as assets, and their health checks."""
