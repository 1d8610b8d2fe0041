# Real workers with the worker tests' fixtures.
from tests.worker.conftest import make_dag, queue_name, scheduler_settings, worker  # noqa: F401
