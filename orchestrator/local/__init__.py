"""The whole stack on one machine (`make run`): SQLite and an embedded Redis by default."""
