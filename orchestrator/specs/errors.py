"""Problems found in a DAG spec, and how they are shown to whoever wrote the spec."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one DAG spec.

    `path` names the field inside the DAG (`schedule`, `default_args.retries`,
    `tasks[1].upstream`, `deadlines[0].callback`); empty when the whole DAG is wrong.
    """

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def dag_label(dag_id: object, index: int) -> str:
    """How a DAG is named in a message: by its id when it has a usable one, else by position."""
    if isinstance(dag_id, str) and dag_id:
        return f"dag {dag_id!r}"
    return f"dag #{index + 1}"


def located(source: str, label: str | None, problem: Problem | str) -> str:
    """`dags/bad.yaml: dag 'settlement': tasks[1].upstream: unknown task 'nope'`."""
    parts = [source] if source else []
    if label:
        parts.append(label)
    parts.append(str(problem))
    return ": ".join(parts)


class SpecError(Exception):
    """One or more problems in the spec files of one import; nothing was written."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("\n".join(messages))
        self.messages = messages
