"""Device profiles: each client's compute speed, radio, energy budget and availability, as data.

A profile is drawn from the ranges of ``system.devices`` with generators derived from the run seed, and
then overridden column by column by a per-client file (CSV or JSON of measured devices); an availability
trace (CSV, one row per round) replaces the availability draws. The system model reads the profiles for
its rates and compute times; the run directory keeps them as ``devices.csv``. A figure the config leaves
out keeps the system's own value, so a run without ``system.devices`` is the uniform fleet it always was.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedge.config import DEVICE_FIGURES, DevicesConfig, SystemConfig, figure_out_of_bounds
from fedge.errors import ConfigError
from fedge.files.regular import NotReadable, read_regular
from fedge.rng import numpy_rng
from fedge.system.channel import draw_distances

FIGURES = DEVICE_FIGURES
KEY = "system.devices"
MAX_FILE_BYTES = 256 * 2**20  # a profile or trace file larger than this is refused unread
NO_BUDGET = ("", "inf", "+inf", "infinity", "+infinity")  # energy_budget_j cells that mean no budget


@dataclass(frozen=True)
class DeviceProfiles:
    """Per-client figures (one entry per client) and the availability trace, if any.

    ``energy_budget_j`` is ``inf`` for a client without a budget; ``trace[r, i]`` says whether client
    ``i`` is online in round ``r + 1`` (rounds past the trace's end cycle through it). ``given`` names the
    figures the config drew or the file gave (the rest hold the system's defaults), for models with
    defaults of their own (the hierarchical family's radio).
    """

    cpu_hz: np.ndarray
    distance_m: np.ndarray
    bandwidth_hz: np.ndarray
    shadowing_db: np.ndarray
    energy_budget_j: np.ndarray
    availability: np.ndarray
    trace: np.ndarray | None = None
    given: frozenset[str] = frozenset()

    @property
    def count(self) -> int:
        return len(self.cpu_hz)

    def online(self, seed: int, round_: int) -> np.ndarray:
        """Which clients are online in ``round_`` (1-based): the trace's row, or one draw per client
        against its availability from the stream ``(seed, "availability", round_)``."""
        if self.trace is not None:
            return self.trace[(round_ - 1) % len(self.trace)].copy()
        if np.all(self.availability >= 1.0):
            return np.ones(self.count, dtype=bool)
        return numpy_rng(seed, "availability", round_).random(self.count) < self.availability

    def columns(self) -> dict[str, np.ndarray]:
        """The per-client figures by name, in :data:`FIGURES` order."""
        return {name: getattr(self, name) for name in FIGURES}


def _draw(rng: np.random.Generator, count: int, ranges: list[tuple[float, float]], log: bool) -> np.ndarray:
    """``count`` values: the clients split into ``len(ranges)`` equal consecutive groups, each drawn
    uniformly (or log-uniformly) from its range."""
    out = np.empty(count, dtype=np.float64)
    for group, rows in enumerate(np.array_split(np.arange(count), len(ranges))):
        low, high = ranges[group]
        if log and low > 0:
            out[rows] = np.exp(rng.uniform(math.log(low), math.log(high), size=len(rows)))
        else:
            out[rows] = rng.uniform(low, high, size=len(rows))
    return out


def _shown(value: object, quoted: bool = True) -> str:
    """A cell as a refusal quotes it (a string in quotes where ``quoted``): at most 40 characters."""
    if isinstance(value, str):
        text = repr(value) if quoted else value
    else:
        try:
            text = json.dumps(value)
        except (TypeError, ValueError, RecursionError):
            text = f"a {type(value).__name__}"
    return text if len(text) <= 40 else f"{text[:36]}..."


def _number(value: object, where: str, infinite: bool = False) -> float:
    """A cell's number (a numeric string or a JSON number); finite unless ``infinite``."""
    number = None
    if isinstance(value, str) or isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)
        except ValueError:
            number = None
        except OverflowError:  # an integer beyond any float
            number = math.inf
    if number is None or math.isnan(number):
        raise ConfigError(f"{KEY}.file", f"{where}: {_shown(value)} is not a number")
    if not (infinite or math.isfinite(number)):
        raise ConfigError(f"{KEY}.file", f"{where}: {_shown(value)} is not a finite number")
    return number


def _budget(value: object, where: str) -> float:
    """An energy budget cell: joules, or no budget (``inf``) for a blank cell, ``inf`` or JSON null."""
    if value is None or isinstance(value, str) and value.strip().lower() in NO_BUDGET:
        return math.inf
    return _number(value, where, infinite=True)


def _text(path: Path, key: str) -> str:
    """The UTF-8 text of ``path``, a regular file of at most :data:`MAX_FILE_BYTES`; a one-line error
    naming ``key`` when it cannot be read (a FIFO or a device is refused without waiting on it)."""
    try:
        raw = read_regular(path, MAX_FILE_BYTES)
    except NotReadable as error:
        raise ConfigError(key, f"{path}: {error}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(key, f"{path}: is not UTF-8 text") from None


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose keys are distinct (a repeated key would silently override the first)."""
    row = dict(pairs)
    if len(row) != len(pairs):
        repeated = next(key for i, (key, _) in enumerate(pairs) if key in dict(pairs[:i]))
        raise ValueError(f"key {_shown(repeated)} appears twice in one object")
    return row


def _integer(digits: str) -> int | str:
    """A JSON integer; past 300 digits (beyond any float) its digits, which Python's ``int`` would refuse
    past 4,300 with an error of its own."""
    return int(digits) if len(digits) <= 300 else digits


def _json_rows(path: Path, text: str) -> list[dict[str, object]]:
    """The per-client objects of a JSON profile file (a list, or ``{"clients": [...]}``); an integer of
    more digits than any figure has stays its digits, refused as a number rather than converted."""
    try:
        data = json.loads(text, parse_int=_integer, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ConfigError(f"{KEY}.file", f"{path}: not JSON this reader takes (nested too deeply)") from None
    except ValueError as error:
        raise ConfigError(f"{KEY}.file", f"{path}: not JSON ({error})") from None
    if isinstance(data, dict) and isinstance(data.get("clients"), list):
        data = data["clients"]
    if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
        raise ConfigError(f"{KEY}.file", f"{path}: expected a list of per-client objects")
    return data


def _csv_rows(path: Path, text: str) -> list[dict[str, object]]:
    """The rows of a CSV profile file by its header: each row exactly as many cells as the header,
    each column named once."""
    try:
        lines = [cells for cells in csv.reader(io.StringIO(text)) if cells]
    except csv.Error as error:
        raise ConfigError(f"{KEY}.file", f"{path}: not CSV ({error})") from None
    if not lines:
        raise ConfigError(f"{KEY}.file", f"{path}: empty (expected a header: client,cpu_hz,...)")
    header = [cell.strip() for cell in lines[0]]
    repeated = next((name for i, name in enumerate(header) if name in header[:i]), None)
    if repeated is not None:
        raise ConfigError(f"{KEY}.file", f"{path}: column {_shown(repeated)} appears twice")
    rows: list[dict[str, object]] = []
    for line, cells in enumerate(lines[1:], start=1):
        if len(cells) != len(header):
            count = f"{len(cells)} cell{'s' * (len(cells) != 1)}"
            raise ConfigError(f"{KEY}.file", f"{path}: row {line} has {count}, the header {len(header)}")
        rows.append(dict(zip(header, (cell.strip() for cell in cells), strict=True)))
    return rows


def _read_file(path: Path, count: int) -> dict[str, np.ndarray]:
    """The figures a profile file gives, by name: every client 0..count-1 exactly once, each figure
    within its physical range (:data:`~fedge.config.FIGURE_BOUNDS`)."""
    text = _text(path, f"{KEY}.file")
    rows = _json_rows(path, text) if path.suffix.lower() == ".json" else _csv_rows(path, text)
    columns: dict[str, np.ndarray] = {}
    seen = np.zeros(count, dtype=bool)
    for line, row in enumerate(rows, start=1):
        unknown = sorted(set(row) - {"client", *FIGURES})
        if unknown:
            known = f"known: client, {', '.join(FIGURES)}"
            raise ConfigError(f"{KEY}.file", f"{path}: unknown column {_shown(unknown[0])}; {known}")
        if "client" not in row:
            raise ConfigError(f"{KEY}.file", f"{path}: row {line} has no 'client'")
        client = _number(row["client"], f"{path}: row {line} client")
        if client != int(client) or not 0 <= client < count:
            shown = _shown(row["client"], quoted=False)
            raise ConfigError(
                f"{KEY}.file", f"{path}: row {line}: client {shown} is not one of 0..{count - 1}"
            )
        client = int(client)
        if seen[client]:
            raise ConfigError(f"{KEY}.file", f"{path}: client {client} appears twice")
        seen[client] = True
        for name in FIGURES:
            if name not in row:
                continue
            where = f"{path}: row {line} {name}"
            read = _budget if name == "energy_budget_j" else _number
            value = read(row[name], where)
            reason = None if value == math.inf else figure_out_of_bounds(name, value)
            if reason is not None:
                raise ConfigError(f"{KEY}.file", f"{path}: row {line}: {reason}")
            columns.setdefault(name, np.full(count, np.nan))[client] = value
    if not seen.all():
        missing = int(np.flatnonzero(~seen)[0])
        raise ConfigError(
            f"{KEY}.file", f"{path}: has {int(seen.sum())} of {count} clients (client {missing} is missing)"
        )
    for name, values in columns.items():
        if np.isnan(values).any():
            client = int(np.flatnonzero(np.isnan(values))[0])
            raise ConfigError(f"{KEY}.file", f"{path}: client {client} has no {name}")
    return columns


def _read_trace(path: Path, count: int) -> np.ndarray:
    """An availability trace: one row per round of ``count`` 0/1 values (a first non-numeric row is a
    header; lines starting with ``#`` are comments)."""
    lines = _text(path, f"{KEY}.trace").splitlines()
    rows: list[list[bool]] = []
    for number, line in enumerate(lines, start=1):
        cells = [cell.strip() for cell in line.split(",")]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not rows and not all(cell in ("0", "1") for cell in cells) and number == 1:
            continue  # a header
        if len(cells) != count or not all(cell in ("0", "1") for cell in cells):
            raise ConfigError(f"{KEY}.trace", f"{path}: line {number} is not {count} values of 0 or 1")
        rows.append([cell == "1" for cell in cells])
    if not rows:
        raise ConfigError(f"{KEY}.trace", f"{path}: holds no round")
    return np.array(rows, dtype=bool)


def device_profiles(cfg: SystemConfig, count: int, seed: int) -> DeviceProfiles:
    """The profiles of ``count`` clients: ``cfg.devices``'s draws and files over the system's defaults.

    Each figure draws from its own stream ``(seed, "devices", name)``; distances left out are the
    system's own draw (the same numbers as a run without profiles).
    """
    devices = cfg.devices or DevicesConfig()
    log = devices.spread == "log"
    default_distances = draw_distances(
        numpy_rng(seed, "system-distances"), count, cfg.distance_min_m, cfg.distance_max_m, cfg.distances
    )
    defaults = {
        "cpu_hz": np.full(count, cfg.client_cpu_hz),
        "distance_m": default_distances,
        "bandwidth_hz": np.full(count, cfg.bandwidth_hz),
        "shadowing_db": np.zeros(count),
        "energy_budget_j": np.full(count, np.inf),
        "availability": np.ones(count),
    }
    figures = {}
    for name in FIGURES:
        ranges = getattr(devices, name)
        drawn = ranges is not None
        figures[name] = (
            _draw(numpy_rng(seed, "devices", name), count, ranges, log) if drawn else defaults[name]
        )
    given = {name for name in FIGURES if getattr(devices, name) is not None}
    if devices.file is not None:
        read = _read_file(Path(devices.file), count)
        figures.update(read)
        given.update(read)
    trace = None if devices.trace is None else _read_trace(Path(devices.trace), count)
    return DeviceProfiles(**figures, trace=trace, given=frozenset(given))


def profiles_csv(profiles: DeviceProfiles, up_bps: np.ndarray, down_bps: np.ndarray) -> str:
    """``devices.csv``: one row per client with its figures and its mean rates without fading."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["client", *FIGURES, "up_bps", "down_bps"])
    columns = profiles.columns()
    for i in range(profiles.count):
        writer.writerow(
            [
                i,
                *(repr(float(columns[n][i])) for n in FIGURES),
                repr(float(up_bps[i])),
                repr(float(down_bps[i])),
            ]
        )
    return out.getvalue()
