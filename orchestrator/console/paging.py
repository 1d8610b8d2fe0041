"""Where one page of rows sits among them all: what a console pager shows ("Tasks 101–200 of
10000", previous, next). The DAG page's grid and task list, the run page and a mapped task's
page each read one page of rows; this is the arithmetic they share."""
from __future__ import annotations

from dataclasses import dataclass


def page_count(total: int, per_page: int) -> int:
    """How many pages `total` rows fill (one, empty, when there are none)."""
    return max(1, -(-total // per_page))


@dataclass(frozen=True)
class Span:
    number: int  # this page, 1-based
    pages: int
    first: int  # 1-based positions of the page's first and last rows among them all (0 when none)
    last: int
    total: int

    @classmethod
    def of(cls, number: int, per_page: int, total: int, shown: int) -> Span:
        """Page `number` of `total` rows, `per_page` a page, showing `shown` of them."""
        first = (number - 1) * per_page + 1 if shown else 0
        return cls(number, page_count(total, per_page), first, first + shown - 1 if shown else 0, total)

    @property
    def previous(self) -> int | None:
        return self.number - 1 if self.number > 1 else None

    @property
    def next(self) -> int | None:
        return self.number + 1 if self.number < self.pages else None
