"""One router per resource: sessions, pods, health.

Imports neither zmq nor subscriber/; routes reach the store only through api.reader.
"""
