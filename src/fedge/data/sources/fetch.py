"""Finding and fetching dataset files: the per-user cache folder, downloads, and not-found errors.

Only with ``data.download=true`` does a source fetch anything, so a run never depends on the network
silently; a download goes to a temporary file that is renamed into place.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Sequence
from pathlib import Path

from fedge.errors import DataError
from fedge.files import umask


def cache_folder(name: str) -> Path:
    """The per-user folder a dataset is looked for in, and downloaded to, when ``data.root`` is unset."""
    return Path.home() / ".cache" / "fedge" / name


def download(urls: Sequence[str], dest: Path) -> Path:
    """Fetch the first URL that answers to ``dest`` (via a temporary file renamed into place); return it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    failures = []
    for url in urls:
        try:
            with (
                umask.staged_file(dest, suffix=".part") as out,
                urllib.request.urlopen(url, timeout=60) as response,
            ):
                while chunk := response.read(1 << 20):
                    out.write(chunk)
            return dest
        except OSError as error:  # URLError and HTTPError are OSErrors
            failures.append(f"{url} ({getattr(error, 'reason', error)})")
    raise DataError(f"{dest}: download failed from {'; '.join(failures)}")


def not_found(name: str, looked: Sequence[Path], hint: str | None) -> DataError:
    """The one-line error for a dataset found nowhere, saying where we looked and how to fix it."""
    fixes = ["set data.root=DIR", "data.download=true", *([hint] if hint else [])]
    where = ", ".join(str(folder) for folder in looked)
    return DataError(f"{name}: dataset files not found in {where}; {', or '.join(fixes)}")
