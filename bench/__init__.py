"""Benchmarks of the engine, run on demand and never by the test suite: `python -m bench`.

Importing this package has no side effects (no Django, no database): the task processes of a
benchmark import `bench.tasks` from it.
"""
