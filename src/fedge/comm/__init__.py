"""Communication: codecs that count bits exactly, and the ledger of transfers and storage."""

from fedge.comm.codecs import CODECS, Codec, Encoded, FloatCodec, get_codec
from fedge.comm.ledger import Ledger, client_node, direction

__all__ = ["CODECS", "Codec", "Encoded", "FloatCodec", "Ledger", "client_node", "direction", "get_codec"]
