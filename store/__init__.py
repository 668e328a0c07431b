"""The index store: the one place that knows which blocks each worker and session holds.

Imports neither zmq nor fastapi: the subscriber writes through it, the API reads through it.
"""
