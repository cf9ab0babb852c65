"""Files fedge reads and writes: atomic results, staged writes, regular-file reads."""
