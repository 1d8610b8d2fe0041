"""What an operator does and reads: the actions on runs and tasks, their registry, backfills, and the JSON documents the API and the CLI answer with."""
