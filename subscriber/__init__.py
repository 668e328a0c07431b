"""Ingest: ZMQ streams of vLLM KV events, decoded and applied to the index store in order."""
