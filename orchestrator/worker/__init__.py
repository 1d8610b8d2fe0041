"""Running attempts, arranged by the process each module runs in.

- `host/`: the worker process itself (`manage.py run_worker`): RQ's loop and its slots, one
  supervisor thread per attempt, the heartbeat, spool and reaper threads, and its side of the
  fork server;
- `forkserver/`: the fork server (`python -m orchestrator.worker.forkserver`), a warm process
  that forks one task process per attempt and is the worker's watchdog;
- `task/`: the task process, forked by the fork server, that runs one attempt's user code;
- beside them, what more than one of these processes uses: `channel.py` (the supervisor's and
  the task's messages), `classify.py` (what was seen -> an ExecutionContext) and `failpoints.py`.
"""
