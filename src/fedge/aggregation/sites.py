"""The aggregation sites: the places where updates arrive and become new state (``aggregation.stages``'
``at`` names them)."""

SERVER = "server"
"""a server's model from its clients' (FedAvg, the split family's client models, lightweight FedSL)"""
EDGE = "edge"
"""an edge server's model from its cell's clients (HIST, HFedAvg)"""
CLOUD = "cloud"
"""the cloud's model from the cells' (HIST, HFedAvg)"""
PEER = "peer"
"""each client's model from its neighbours' (the decentralized family)"""
BUFFER = "buffer"
"""an asynchronous server's model from its buffer of arrived updates (FedBuff, asynchronous CSE-FSL)"""
