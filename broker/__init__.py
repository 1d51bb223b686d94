"""The persisting broker daemon: one per node, owns storage, serves Queue clients over ZeroMQ."""
