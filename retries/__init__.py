"""Pure retry policy: states, execution contexts, backoff, fingerprints and the decision table.

Nothing in this package touches the database or Django, so every rule is tested directly.
"""
