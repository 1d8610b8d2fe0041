"""Which queues live workers read is told from RQ's records of its workers in two round trips
(`queue_listeners._workers`): the same heartbeats and queues RQ's own `Worker.all` reads."""
from __future__ import annotations

import pytest
from rq import Queue, Worker

from orchestrator.data.queue_listeners import _workers
from orchestrator.foundation.redis_conn import get_redis


@pytest.mark.django_db
def test_the_workers_read_are_rq_s_own():
    redis = get_redis()
    workers = [Worker([Queue(q, connection=redis) for q in queues], name=name, connection=redis)
               for name, queues in (("reads-two", ("default", "reports")), ("reads-one", ("default",)))]
    try:
        for worker in workers:
            worker.register_birth()
            worker.heartbeat()
        ours = sorted((heartbeat, sorted(queues)) for heartbeat, queues in _workers(redis))
        rq_s = sorted((w.last_heartbeat, sorted(w.queue_names())) for w in Worker.all(connection=redis))
        assert ours == rq_s
        assert len(ours) == 2
    finally:
        for worker in workers:
            worker.register_death()
            redis.delete(worker.key)
