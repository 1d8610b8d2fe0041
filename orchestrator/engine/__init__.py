"""The engine: runs, task states, dispatch, reports from workers, and the scheduler pass."""
