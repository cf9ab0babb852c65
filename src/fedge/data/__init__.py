"""Data: offline-first dataset sources, partitioners and the federated view clients train on."""
