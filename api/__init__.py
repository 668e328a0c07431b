"""The read side: a FastAPI app serving the index store over REST (see README.md).

Imports neither zmq nor anything under subscriber/: the API reads the index, never writes it.
"""

from kvsi.api.app import create_app

__all__ = ["create_app"]
