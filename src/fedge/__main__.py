"""``python -m fedge``: the command line."""

from fedge.cli.commands import app

app(prog_name="fedge")
