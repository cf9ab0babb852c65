"""Hierarchical family: HIST submodel training and HFedAvg over cloud, edge servers and clients."""
