"""Gauges /metrics reads at scrape time: states, not counts of events, so they come from the
database and Redis as they are now (the counters live in orchestrator.data.metrics).
"""
from __future__ import annotations

from django.db.models import Count, Sum
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily

from orchestrator.data import queue_listeners
from orchestrator.engine import circuits, storms, waits
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import Circuit, Pool, TaskInstance
from retries.circuits import current_state
from retries.states import CIRCUIT_GAUGE, HOLD_FROM, SLOT_HOLDING_STATES, CircuitState, TaskState


def limit_gauges() -> list[GaugeMetricFamily]:
    """Gauges of what protects downstreams: circuit states, pool slots, held tasks, paused queues.

    Read from the database at scrape time (they are states, not counts of events).
    """
    now = timezone.now()
    state = GaugeMetricFamily("orchestrator_circuit_state", "Circuit breaker state: 0 closed, 1 half-open, 2 open.", labels=["circuit"])
    for circuit in Circuit.objects.order_by("name"):
        current = current_state(CircuitState(circuit.state), circuit.opened_at, now, circuits.settings_for(circuit).cooldown)
        state.add_metric([circuit.name], CIRCUIT_GAUGE[current])
    held = GaugeMetricFamily("orchestrator_tasks_held", "Ready tasks held by a pool, a limit, a circuit or a paused queue.", labels=["kind", "name"])
    rows = (
        TaskInstance.objects.filter(state__in=HOLD_FROM, waiting_for__isnull=False)
        .values_list("waiting_for__kind", "waiting_for__name")
        .annotate(n=Count("id"))
        .order_by()
    )
    for kind, name, count in sorted(rows, key=lambda row: (str(row[0]), str(row[1]))):
        held.add_metric([str(kind), str(name)], count)
    slots = GaugeMetricFamily("orchestrator_pool_slots", "Slots of each pool.", labels=["pool"])
    used = GaugeMetricFamily("orchestrator_pool_slots_used", "Slots held by queued and running tasks.", labels=["pool"])
    in_use = dict(
        TaskInstance.objects.filter(state__in=SLOT_HOLDING_STATES, pool__isnull=False)
        .values_list("pool")
        .annotate(n=Sum("pool_slots"))
        .values_list("pool", "n")
    )
    for pool in Pool.objects.order_by("name"):
        slots.add_metric([pool.name], pool.slots)
        used.add_metric([pool.name], in_use.get(pool.name, 0))
    paused = GaugeMetricFamily("orchestrator_queue_paused", "1 while an infrastructure storm pauses dispatch to the queue.", labels=["queue"])
    for queue in sorted(storms.paused_queues(now)):
        paused.add_metric([queue], 1)
    return [state, held, slots, used, paused]


def system_gauges() -> list[GaugeMetricFamily]:
    """What is running and waiting now: tasks running (the database), jobs waiting in each RQ
    queue and live workers (Redis). Read at scrape time."""
    from rq import Queue

    running = GaugeMetricFamily("orchestrator_tasks_running", "Task instances running now.")
    running.add_metric([], TaskInstance.objects.filter(state=TaskState.RUNNING).count())
    waiting = GaugeMetricFamily(
        "orchestrator_waiting_tasks", "Tasks up_for_reschedule, by what they wait for (reschedule: a rescheduled python task).", labels=["kind"]
    )
    for kind, count in sorted(waits.waiting_counts().items()):
        waiting.add_metric([kind], count)
    redis = get_redis()
    depth = GaugeMetricFamily("orchestrator_queue_depth", "Jobs waiting in each RQ queue.", labels=["queue"])
    for queue in sorted(Queue.all(connection=redis), key=lambda q: q.name):
        depth.add_metric([queue.name], queue.count)
    alive = GaugeMetricFamily("orchestrator_workers_alive", "Workers whose heartbeat in Redis is recent enough to be alive.")
    alive.add_metric([], queue_listeners.live_count(redis))
    return [running, waiting, depth, alive]
