"""A task module that can tell whether its code was compiled by the fork server (imports
nothing of the project at its top, so the fork server never has it loaded)."""
from __future__ import annotations


def compiled_ahead() -> dict[str, bool]:
    """Whether this module's code object is the one the fork server compiled."""
    from orchestrator.worker.forkserver import codecache

    code = codecache.code_of(__file__)
    return {"compiled_ahead": code is not None and any(const is compiled_ahead.__code__ for const in code.co_consts)}
