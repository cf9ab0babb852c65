"""Decentralized family: AFIND+ and its baselines on peer-to-peer topologies (one module per algorithm)."""
