# Real workers with the worker tests' fixtures.
from tests.api.personas import alice, alice_client, bob, bob_client, fast_password_hasher  # noqa: F401
from tests.worker.conftest import make_dag, queue_name, scheduler_settings, worker  # noqa: F401
