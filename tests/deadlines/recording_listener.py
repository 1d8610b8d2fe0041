"""A listener for the deadline tests: records every on_deadline_missed call."""
from orchestrator.listeners import hookimpl

missed: list[int] = []


@hookimpl
def on_deadline_missed(deadline):
    missed.append(deadline.pk)
