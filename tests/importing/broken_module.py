"""A module that raises while it is imported."""
raise RuntimeError("broken on import")
