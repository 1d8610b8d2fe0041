"""The task process: forked warm by the fork server, it runs one attempt (`runner.py`)."""
