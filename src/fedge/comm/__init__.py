"""Communication: codecs that count bits exactly, and the ledger of transfers and storage."""

from fedge.comm.codecs import Codec, Encoded, FloatCodec
from fedge.comm.dropout import apply_dropout, dropout_mask, kept_bits
from fedge.comm.ledger import Ledger, client_node, direction
from fedge.comm.quantize import StochasticQuantizer, stochastic_quantize, variance_bound
from fedge.comm.registry import CODECS, get_codec
from fedge.comm.sparse import SparseCodec, sparse_bits

__all__ = [
    "CODECS",
    "Codec",
    "Encoded",
    "FloatCodec",
    "Ledger",
    "SparseCodec",
    "StochasticQuantizer",
    "apply_dropout",
    "client_node",
    "direction",
    "dropout_mask",
    "get_codec",
    "kept_bits",
    "sparse_bits",
    "stochastic_quantize",
    "variance_bound",
]
