"""The environment a test gives a `kvsi` process: this one's, less any `KVSI_*` variable a
developer has set (it would configure the service under test), plus the test's own."""

from __future__ import annotations

import os


def service_environ(extra: dict[str, str] | None = None) -> dict[str, str]:
    """os.environ without `KVSI_*`, then `extra` over it."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KVSI_")}
    return clean | (extra or {})
