"""A worker's offer to run, in the slot it is freeing, one of the tasks its own report dispatches.

A chain's next task otherwise goes to Redis after the report's commit, and a worker (often the
same one) takes it back a moment later: an enqueue, a blocking pop waking, RQ building the job,
a thread starting it, and a claim of its own (a transaction). A worker reporting a success
offers its slot instead (`offering`): the first task the report's dispatch queues for one of
the offer's queues is claimed for this worker in the same transaction (`Offer.claim_now`, the
worker's own claim), and no job goes to Redis for it. Once the report commits the worker runs
it as it runs any job it claimed.

Nothing new can be lost: the task is claimed by the commit that records the report, so a worker
that dies after it left a claimed task, found by the scheduler when its heartbeat is older than
ORCHESTRATOR_HEARTBEAT_TIMEOUT (`pre_execution_failure`, kind `worker_died`, charged to the
platform) as for any claim. A report whose commit the worker did not hear of (the connection
broke after the server committed) is tried again and found already recorded; the claim that
committed with it is then recognised (`Offer.unheard`: the task still claimed by this worker
under the claimed token, not started) and run at once, as the handshake recognises its own
lost commit, instead of waiting for that timeout. The worker offers only the queues it listens to that hold no job
(a backlog keeps its order), only while it takes jobs at all (not draining or stopping), and
only for a success (a failure's platform retry must not come back to the worker that may be
its cause).

The offer lives in a context variable of the thread that makes the report's database calls, for
the length of the report: a dispatch on the way (`dispatch._dispatch_chunk`) asks `wanted()`;
whatever else dispatches (the scheduler, an operator) sees no offer.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from django.db import transaction


class _Queued(Protocol):
    pk: int
    queue: str


Q = TypeVar("Q", bound=_Queued)


@dataclass
class Offer:
    """One free slot of a worker: the queues it takes from, how it claims, and what it was given."""

    # Asked only when the report dispatches something (most reports do not): the worker's
    # queues that hold no job right now.
    queues: Callable[[], frozenset[str]]
    # The worker's claim (`reporting.claim_within`): what the task runs, or None if it lost.
    claim: Callable[..., Any]
    taken: Any = None  # what `claim` returned, once the transaction that claimed it committed
    # What `claim` returned in a transaction whose commit was not heard of yet (`unheard`).
    unconfirmed: Any = None
    _asked: bool = field(default=False, repr=False)  # one dispatch only may be given it
    _results: dict[str, Any] = field(default_factory=dict, repr=False)

    def ended(self, task_id: str, result: Any) -> None:
        """The report's own task (not mapped) ended with `result`: a task claimed for the slot
        that waits for it is given it without reading it back."""
        self._results[task_id] = result

    def choose(self, tis: Iterable[Q]) -> Q | None:
        """The first of `tis` (in dispatch order) this slot may take; None if none, or if an
        earlier dispatch of this report was already offered it."""
        if self._asked:
            return None
        self._asked = True
        queues = self.queues()
        return next((ti for ti in tis if ti.queue in queues), None)

    def claim_now(self, task_instance_id: int, token: int) -> bool:
        """Claim the chosen task in the dispatch's transaction; it is `taken` once that commits
        (a transaction rolled back gives nothing)."""
        claimed = self.claim(task_instance_id, token, known_results=self._results)
        if claimed is None:
            return False
        self.unconfirmed = claimed
        transaction.on_commit(lambda: setattr(self, "taken", claimed))
        return True

    def unheard(self, holds_claim: Callable[[int, int], bool]) -> Any:
        """What was claimed for the slot in a transaction whose commit the worker did not hear
        of, if it committed after all: `holds_claim(pk, token)` (asked of the database) says the
        task is still claimed by this worker under that token and not started, which only that
        commit (or this worker's own claim of the same attempt, which the handshake fences)
        can have done. None when nothing waits unheard, or it did not commit."""
        claimed = self.unconfirmed
        if self.taken is not None or claimed is None:
            return None
        return claimed if holds_claim(claimed.pk, claimed.attempt_token) else None


_offer: ContextVar[Offer | None] = ContextVar("handover_offer", default=None)


def wanted() -> Offer | None:
    """The offer of the report being made in this thread, if any."""
    return _offer.get()


@contextmanager
def offering(offer: Offer | None) -> Iterator[Offer | None]:
    token = _offer.set(offer)
    try:
        yield offer
    finally:
        _offer.reset(token)


T = TypeVar("T")


def call_offering(offer: Offer | None, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`function(*args, **kwargs)` with `offer` made in this thread (the database pool's thread
    a worker's report runs on)."""
    with offering(offer):
        return function(*args, **kwargs)
