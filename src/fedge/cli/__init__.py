"""The ``fedge`` command line: its commands and what only they need."""
