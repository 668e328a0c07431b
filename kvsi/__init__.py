"""kv-session-index: command line, settings and wiring of ingest, store and API."""
