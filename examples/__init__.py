"""Callables used by the example DAGs in `dags/`."""
