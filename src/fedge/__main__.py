"""``python -m fedge``: the command line."""

from fedge.cli import app

app(prog_name="fedge")
