"""`python -m kvsi`: the same CLI as the `kvsi` console script."""

from kvsi.cli import app

app()
