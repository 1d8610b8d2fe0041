"""The fork server: `python -m orchestrator.worker.forkserver` (see `server.py`). Its package
imports nothing, so the process holds only what `server.preload()` chooses."""
