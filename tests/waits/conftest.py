"""Real workers on a queue of the test's own, and the API's personas (the worker and API tests' fixtures)."""
from tests.api.personas import alice, alice_client, bob, bob_client  # noqa: F401
from tests.worker.conftest import make_dag, queue_name, scheduler_settings, worker  # noqa: F401
