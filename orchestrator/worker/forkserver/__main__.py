"""`python -m orchestrator.worker.forkserver SOCKET_FD`: how the worker's launcher starts it."""
import sys

from orchestrator.worker.forkserver.server import main

main(sys.argv)
