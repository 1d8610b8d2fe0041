"""A small extract -> transform -> load pipeline for the `example_etl` DAG.

Each step prints what it did (the output is kept with the attempt) and returns a small
JSON-able summary. There is no data passing between tasks: every step recomputes its
input from the run's logical date, which keeps a retried step idempotent.
"""
from __future__ import annotations

from typing import Any

ORDERS = [
    {"id": 1, "amount": 120.0, "currency": "EUR"},
    {"id": 2, "amount": 80.5, "currency": "EUR"},
    {"id": 3, "amount": 42.0, "currency": "USD"},
]


def extract(source: str, context: dict[str, Any]) -> dict[str, Any]:
    """Pretend to read the day's orders from `source`."""
    print(f"extracting {len(ORDERS)} orders from {source} for {context['logical_date']}")
    return {"rows": len(ORDERS)}


def transform_a(context: dict[str, Any]) -> dict[str, Any]:
    """Total revenue per currency."""
    totals: dict[str, float] = {}
    for order in ORDERS:
        totals[order["currency"]] = totals.get(order["currency"], 0.0) + order["amount"]
    print(f"revenue by currency: {totals}")
    return totals


def transform_b(min_amount: float = 50.0, **kwargs: Any) -> dict[str, Any]:
    """Orders over `min_amount`; takes the context through **kwargs."""
    large = [order["id"] for order in ORDERS if order["amount"] >= min_amount]
    print(f"{len(large)} large orders in run {kwargs['context']['run_id']}: {large}")
    return {"large_orders": large}


def load(target: str, context: dict[str, Any]) -> dict[str, Any]:
    """Pretend to write the results to `target`, keyed by run so a retry overwrites, not duplicates."""
    key = f"{context['dag_id']}/{context['run_id']}"
    print(f"loaded results into {target} under {key}")
    return {"target": target, "key": key}
