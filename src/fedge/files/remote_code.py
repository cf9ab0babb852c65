"""Refuse a model or tokenizer folder that asks transformers to run its own Python code.

A checkpoint's ``config.json`` or ``tokenizer_config.json`` may hold an ``auto_map``: class names in the
folder's (or a hub repository's) ``.py`` files, which transformers imports (it asks on standard input
when no ``trust_remote_code`` is passed). fedge passes ``trust_remote_code`` explicitly on every load and
refuses such a folder in one line before transformers reads it, unless the run opts in
(``model.options.trust_remote_code: true``; a tokenizer folder is always refused).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedge.errors import ConfigError

FILES = ("config.json", "tokenizer_config.json")


def _auto_map(file: Path) -> bool:
    """Whether a JSON file names code of its own (an ``auto_map``); an unreadable file is left to the
    loader's own message."""
    try:
        content = json.loads(file.read_text()) if file.is_file() else None
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(content, dict) and "auto_map" in content


def refuse_local(name: str, key: str, allowed: bool, hint: str) -> None:
    """A :class:`ConfigError` on ``key`` when the local folder ``name`` has a file with an ``auto_map``
    and remote code is not ``allowed``; ``hint`` says how to allow it (empty: it cannot be)."""
    folder = Path(name)
    if allowed or not folder.is_dir():
        return
    for file in FILES:
        if _auto_map(folder / file):
            raise ConfigError(
                key, f"{folder / file} has an auto_map (code of the folder's own); fedge runs none{hint}"
            )


def refuse_loaded(config: Any, name: str, key: str, allowed: bool, hint: str) -> None:
    """The same refusal for a config already read (a hub checkpoint, downloaded without running code)."""
    if not allowed and getattr(config, "auto_map", None):
        raise ConfigError(key, f"{name} has an auto_map (code of its own); fedge runs none{hint}")
