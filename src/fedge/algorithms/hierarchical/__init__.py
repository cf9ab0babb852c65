"""Hierarchical family: HIST submodel training and HFedAvg over cloud, edge servers and clients."""

from fedge.algorithms.hierarchical.config import HFedAvgConfig, HISTConfig, RadioConfig
from fedge.algorithms.hierarchical.hfedavg import HFedAvg
from fedge.algorithms.hierarchical.hist import HIST

__all__ = ["HFedAvg", "HFedAvgConfig", "HIST", "HISTConfig", "RadioConfig"]
