"""Names for runs that say what differs between them: the config keys whose values are not all equal."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from fedge.files import results

IGNORED = ("output.", "tracking")  # where results go and who watches: never what makes runs differ


def flatten(raw: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``dotted.key -> value``."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def config_diff(configs: Sequence[dict[str, Any]], ignore: Sequence[str] = ()) -> dict[str, list[Any]]:
    """The dotted keys whose values differ between ``configs``, with each config's value (None: unset)."""
    flat = [flatten(c) for c in configs]
    keys = dict.fromkeys(k for f in flat for k in f if not k.startswith(IGNORED) and k not in ignore)
    return {k: [f.get(k) for f in flat] for k in keys if len({repr(f.get(k)) for f in flat}) > 1}


def short_keys(keys: Sequence[str]) -> dict[str, str]:
    """Each key's last part where that is unambiguous, else the whole dotted key."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: part if last.count(part) == 1 else k for k, part in zip(keys, last, strict=True)}


def labels(
    configs: Sequence[dict[str, Any]], fallback: Sequence[str], ignore: Sequence[str] = ()
) -> list[str]:
    """One legend label per config, e.g. ``cse_fsl, h=2, seed=1``; ``fallback`` when nothing differs."""
    diff = config_diff(configs, ignore)
    # keys that differ only in being set or not (another algorithm's defaults) name nothing
    diff = {k: v for k, v in diff.items() if len({repr(x) for x in v if x is not None}) > 1}
    if not diff:
        return list(fallback)
    order = sorted(diff, key=lambda k: (k != "algorithm.name", k == "seed"))  # the algorithm first, seed last
    diff = {k: diff[k] for k in order}
    names = short_keys(list(diff))
    out = []
    for i in range(len(configs)):
        parts = []
        for key, values in diff.items():
            if values[i] is None:
                continue
            parts.append(f"{values[i]}" if key == "algorithm.name" else f"{names[key]}={values[i]}")
        out.append(", ".join(parts) or fallback[i])
    return out


def run_labels(run_dirs: Sequence[Path], ignore: Sequence[str] = ()) -> list[str]:
    """Legend labels of run directories from their saved configs (directory names if all are alike)."""
    configs = [yaml.safe_load((Path(d) / results.CONFIG).read_text()) or {} for d in run_dirs]
    fallback = (
        [Path(d).name for d in run_dirs]
        if not ignore
        else [c.get("algorithm", {}).get("name", "") for c in configs]
    )
    return labels(configs, fallback, ignore)
