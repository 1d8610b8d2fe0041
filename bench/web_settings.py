"""The project's settings with one middleware more, first in the chain: the benchmark's web
server reports each request's time inside Django (bench/servertiming.py)."""
from orchestrator.settings import *  # noqa: F403
from orchestrator.settings import MIDDLEWARE

MIDDLEWARE = ["bench.servertiming.ServerTiming", *MIDDLEWARE]
