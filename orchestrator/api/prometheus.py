"""GET /metrics: the Redis counters of orchestrator.data.metrics in the Prometheus text format.

The counters live in Redis, so every process's increments show up here, whichever web
process serves the scrape.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator

from django.http import HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from orchestrator.api import gauges
from orchestrator.api.access import api_view, json_error
from orchestrator.data import metrics

log = logging.getLogger(__name__)


class RedisCounterCollector:
    """Yields one counter family per entry of orchestrator.data.metrics.METRICS, read at scrape time."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        for name, (help_text, label_names) in metrics.METRICS.items():
            # CounterMetricFamily adds the _total suffix to the samples itself.
            family = CounterMetricFamily(name.removesuffix("_total"), help_text, labels=label_names)
            for labels, value in sorted(metrics.read(name), key=lambda item: sorted(item[0].items())):
                family.add_metric([labels[label] for label in label_names], value)
            yield family


class LimitGaugeCollector:
    """Circuits, pools and held tasks, read from the database at scrape time."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from gauges.limit_gauges()


class SystemGaugeCollector:
    """Tasks running, queue depths and live workers, read at scrape time."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from gauges.system_gauges()


def render() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RedisCounterCollector())
    registry.register(LimitGaugeCollector())
    registry.register(SystemGaugeCollector())
    return generate_latest(registry)


@api_view(["GET"])
def metrics_view(request: HttpRequest) -> HttpResponse:
    try:
        body = render()
    except Exception:
        log.exception("could not read metrics from Redis")
        return json_error(503, "metrics are unavailable: could not read them from Redis")
    return HttpResponse(body, content_type=CONTENT_TYPE_PLAIN_0_0_4)
