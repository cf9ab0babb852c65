"""Tokenizers for text data: bytes (the offline default) or a Hugging Face tokenizer when one is named.

The byte-level tokenizer maps a text to its UTF-8 bytes: a vocabulary of 256 tokens, no file, no
download, every text representable (a character-level model for ASCII text). A Hugging Face tokenizer
(``data.tokenizer``: a hub name or a local folder) gives a pretrained model the ids it was trained on; it
is read from the local cache, and downloaded only with ``data.download: true``; a tokenizer that would run
code of its own (an ``auto_map``) is refused (:mod:`fedge.files.remote_code`).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from fedge.errors import ConfigError
from fedge.files.remote_code import refuse_local

BYTES = "bytes"
FRAMING_PROBE = "a sample"  # a text whose framing shows a tokenizer's special tokens


class Tokenizer(Protocol):
    """Text to token ids, and the size of the id space."""

    name: str
    vocab_size: int
    pad_id: int | None  # the id a padded sequence is filled with (None: the tokenizer has none)

    def encode(self, text: str) -> np.ndarray: ...

    def encode_sample(self, text: str, length: int) -> np.ndarray:
        """One stand-alone sample's ids, at most ``length``, with the tokenizer's special tokens."""
        ...

    def frame(self, ids: np.ndarray) -> np.ndarray:
        """Ids of a text (``encode``'s) framed as one stand-alone sample: the special tokens around them."""
        ...

    @property
    def framing(self) -> int:
        """How many special tokens :meth:`frame` adds."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: ids 0..255; padding is 0, the NUL byte, which text does not hold (and
    BERT's own ``[PAD]`` id)."""

    name = BYTES
    vocab_size = 256
    pad_id = 0
    framing = 0  # no special tokens

    def encode(self, text: str) -> np.ndarray:
        """The text's UTF-8 bytes as int64 ids."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def encode_sample(self, text: str, length: int) -> np.ndarray:
        """The text's first ``length`` bytes (bytes have no special tokens)."""
        return self.encode(text)[:length]

    def frame(self, ids: np.ndarray) -> np.ndarray:
        """The ids as they are (bytes have no special tokens)."""
        return ids

    def decode(self, ids: Any) -> str:
        """Ids back to text (invalid UTF-8 replaced)."""
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class HFTokenizer:
    """A Hugging Face tokenizer: ids without special tokens (text to pack), or one sample with them; the
    vocabulary its full length."""

    def __init__(self, name: str, download: bool):
        try:
            import transformers
        except ImportError:
            raise ConfigError(
                "data.tokenizer", "a Hugging Face tokenizer needs the llm extra: fedge[llm]"
            ) from None
        refuse_local(name, "data.tokenizer", False, "")
        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(
                name, local_files_only=not download, trust_remote_code=False
            )
        except (OSError, ValueError) as error:
            hint = "" if download else " (set data.download: true to fetch it)"
            raise ConfigError("data.tokenizer", f"cannot load {name!r}{hint}: {error}") from None
        except (KeyError, TypeError, AttributeError) as error:  # a field transformers reads unguarded
            malformed = f"its files are malformed ({type(error).__name__}: {error})"
            raise ConfigError("data.tokenizer", f"cannot load {name!r}: {malformed}") from None
        self.name = name
        self.vocab_size = len(self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id
        self.prefix, self.suffix = self._special_tokens()

    def _special_tokens(self) -> tuple[list[int], list[int]]:
        """The special tokens a stand-alone sample starts and ends with (BERT: ``[CLS]`` and ``[SEP]``, a
        LLaMA tokenizer: BOS and none, GPT-2: none), read off the tokenizer's own framing of a probe text."""
        bare = self.tokenizer.encode(FRAMING_PROBE, add_special_tokens=False)
        framed = self.tokenizer(FRAMING_PROBE)["input_ids"]
        for start in range(len(framed) - len(bare) + 1):
            if framed[start : start + len(bare)] == bare:
                return framed[:start], framed[start + len(bare) :]
        changed = f"{self.name} changes a text's own tokens when it frames a sample"
        raise ConfigError("data.tokenizer", changed)

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False), dtype=np.int64)

    def encode_sample(self, text: str, length: int) -> np.ndarray:
        """The text as the model was trained to read one sample (BERT: ``[CLS] text [SEP]``, which its
        pooler and classifier expect), the text truncated so that the whole is at most ``length``."""
        ids = self.tokenizer(text, truncation=True, max_length=length)["input_ids"]
        return np.asarray(ids, dtype=np.int64)

    def frame(self, ids: np.ndarray) -> np.ndarray:
        """The special tokens of one sample around ``ids``."""
        return np.concatenate([np.asarray(self.prefix, np.int64), ids, np.asarray(self.suffix, np.int64)])

    @property
    def framing(self) -> int:
        return len(self.prefix) + len(self.suffix)


def make_tokenizer(name: str, download: bool = False) -> Tokenizer:
    """The tokenizer ``data.tokenizer`` names (``bytes``, or a Hugging Face name or folder)."""
    return ByteTokenizer() if name == BYTES else HFTokenizer(name, download)
