from tests.api.personas import (  # noqa: F401
    alice,
    alice_client,
    anonymous_client,
    bob,
    bob_client,
    fast_password_hasher,
)
