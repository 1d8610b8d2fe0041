from tests.api.personas import alice, alice_client, fast_password_hasher  # noqa: F401  (fixtures)
