"""ExecutionContext: why a task changed state, created where the change was first seen."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from retries.states import CATEGORY_OF_REASON, Category, Reason, Source


@dataclass(frozen=True)
class ExecutionContext:
    category: Category
    reason: Reason
    source: Source
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, reason: Reason, source: Source, **metadata: Any) -> ExecutionContext:
        """A context whose category follows from its reason."""
        return cls(CATEGORY_OF_REASON[Reason(reason)], Reason(reason), Source(source), dict(metadata))

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category.value,
            "reason": self.reason.value,
            "source": self.source.value,
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecutionContext:
        return cls(
            Category(data["category"]),
            Reason(data["reason"]),
            Source(data["source"]),
            dict(data.get("metadata") or {}),
        )

    def with_reason(self, reason: Reason, **extra: Any) -> ExecutionContext:
        """The same failure recharged under another reason (e.g. startup_error, poisoned)."""
        return ExecutionContext(
            CATEGORY_OF_REASON[reason], reason, self.source, {**self.metadata, **extra}
        )
