"""Communication: codecs that count bits exactly, links that send through them, and the ledger."""

from fedge.comm import nodes
from fedge.comm.codecs import Codec, Encoded, FloatCodec
from fedge.comm.dropout import apply_dropout, dropout_mask
from fedge.comm.ledger import Ledger
from fedge.comm.link import Link, Network, Sent, state_bits
from fedge.comm.nodes import direction
from fedge.comm.quantize import StochasticQuantizer, stochastic_quantize, variance_bound
from fedge.comm.registry import CODECS, get_codec
from fedge.comm.sparse import SparseCodec, sparse_bits

__all__ = [
    "CODECS",
    "Codec",
    "Encoded",
    "FloatCodec",
    "Ledger",
    "Link",
    "Network",
    "Sent",
    "SparseCodec",
    "StochasticQuantizer",
    "apply_dropout",
    "direction",
    "dropout_mask",
    "get_codec",
    "nodes",
    "sparse_bits",
    "state_bits",
    "stochastic_quantize",
    "variance_bound",
]
