"""One run, written once for every algorithm: the round loop, checkpoints, resume, stop rules."""
