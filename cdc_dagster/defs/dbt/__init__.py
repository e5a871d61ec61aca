"""The dbt downstream in Dagster: the models as assets, and the sensor that builds them at each syncpoint."""
