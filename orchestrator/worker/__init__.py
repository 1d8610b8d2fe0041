"""The worker side: the RQ job that supervises a task process, and everything it needs."""
