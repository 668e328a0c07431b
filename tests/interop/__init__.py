"""Interop tier: kvsi against vLLM's own KV cache manager and event publisher (make interop)."""
