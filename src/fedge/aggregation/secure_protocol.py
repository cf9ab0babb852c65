"""Secure aggregation's protocol, simulated: key agreement, Shamir shares, double masking and the
server's unmasking (Bonawitz et al., "Practical secure aggregation for privacy-preserving machine
learning", CCS 2017; SecAgg+'s sparse graph from Bell et al., "Secure single-server aggregation with
(poly)logarithmic overhead", CCS 2020).

One aggregation of ``n`` senders over vectors of ``d`` integers mod ``2^bits``:

1. Every sender ``u`` draws a masking key pair ``(s_u, g^s_u)`` and a self-mask seed ``b_u``, and
   advertises its public keys (a masking and an encryption key) through the server to its neighbours
   (every other sender, or ``k`` of them on SecAgg+'s random ``k``-regular graph).
2. It splits ``s_u`` and ``b_u`` into Shamir shares with threshold ``t`` among its holders (its
   neighbours and itself) and sends each neighbour its pair of shares, encrypted, through the server.
3. It sends ``y_u = x_u + PRG(b_u) + sum_{v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv)`` over its
   neighbours ``v``, ``s_uv`` the secret the two agree; a sender that drops out sends nothing here.
4. The server tells the survivors who survived; each returns its share of ``b_u`` for every surviving
   holder-mate and of ``s_u`` for every dropped one. With ``t`` shares of each the server rebuilds every
   survivor's ``b_u`` and every dropped sender's ``s_u``, removes the self masks and the pairwise masks the
   survivors still carry towards the dropped, and is left with the survivors' sum and nothing else.

What is simulated: the keys come from the run seed (:func:`fedge.rng.derive_seed`), so a run repeats;
the encrypted shares are handed over in memory and only their ciphertext bits are counted
(:func:`secagg_traffic`), so only the masking key pairs are drawn (the encryption keys are counted on
the wire, never used). Key agreement is X25519 from the ``cryptography`` package where it is
installed, else Diffie-Hellman over RFC 3526's 2048-bit safe-prime group with Python integers; both give
the same sums (the masks cancel either way). Shamir's scheme is written here over the prime field of
``2^255 - 19``: it is a few lines of Lagrange interpolation and no well-kept library offers exactly
this (shares of field elements with chosen evaluation points).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from fedge.rng import derive_seed

FIELD_PRIME = 2**255 - 19
"""Shamir's field: every secret (a masking key, a self-mask seed) is one of its elements."""
KEY_BITS = 256
"""A public key on the wire (X25519's 32 bytes, what a deployment sends)."""
SHARE_BITS = 256
"""A Shamir share on the wire (one field element)."""
ID_BITS = 32
"""A sender's id on the wire."""
CIPHER_BITS = 2 * SHARE_BITS + 2 * ID_BITS + 96 + 128
"""One encrypted pair of shares: two shares, the two ends' ids, an AES-GCM nonce (96) and tag (128)."""

MODP_PRIME = int(
    "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74"
    "020BBEA63B139B22514A08798E3404DDEF9519B3CD3A431B302B0A6DF25F1437"
    "4FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED"
    "EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF05"
    "98DA48361C55D39A69163FA8FD24CF5F83655D23DCA3AD961C62F356208552BB"
    "9ED529077096966D670C354E4ABC9804F1746C08CA18217C32905E462E36CE3B"
    "E39E772C180E86039B2783A2EC07A28FB5C55DF06F4C52C9DE2BCBF695581718"
    "3995497CEA956AE515D2261898FA051015728E5A8AACAA68FFFFFFFFFFFFFFFF",
    16,
)
"""RFC 3526's 2048-bit MODP group (a safe prime, generator 2): the fallback key agreement's group."""
MODP_GENERATOR = 2


# Shamir's secret sharing ------------------------------------------------------------------------


def shamir_share(secret: int, threshold: int, holders: int, rng: random.Random) -> list[tuple[int, int]]:
    """``holders`` shares ``(x, f(x))``, ``x = 1..holders``, of ``secret``: ``f`` a random polynomial of
    degree ``threshold - 1`` over the field with ``f(0) = secret``; any ``threshold`` rebuild it, fewer
    say nothing of it."""
    if not 1 <= threshold <= holders:
        raise ValueError(f"threshold {threshold} must lie in 1..{holders} holders")
    coefficients = [secret % FIELD_PRIME, *(rng.randrange(FIELD_PRIME) for _ in range(threshold - 1))]
    shares = []
    for x in range(1, holders + 1):
        value = 0
        for c in reversed(coefficients):  # Horner's rule
            value = (value * x + c) % FIELD_PRIME
        shares.append((x, value))
    return shares


def shamir_reconstruct(shares: Sequence[tuple[int, int]]) -> int:
    """The secret ``f(0)`` from shares ``(x, f(x))`` by Lagrange interpolation at zero (exactly the
    secret when there are at least the threshold's many)."""
    secret = 0
    for i, (xi, yi) in enumerate(shares):
        numerator, denominator = 1, 1
        for j, (xj, _) in enumerate(shares):
            if i != j:
                numerator = numerator * -xj % FIELD_PRIME
                denominator = denominator * (xi - xj) % FIELD_PRIME
        secret = (secret + yi * numerator * pow(denominator, -1, FIELD_PRIME)) % FIELD_PRIME
    return secret


# Key agreement ----------------------------------------------------------------------------------


def _x25519_available() -> bool:
    try:
        from cryptography.hazmat.primitives.asymmetric import x25519  # noqa: F401
    except ImportError:
        return False
    return True


X25519 = _x25519_available()
"""Whether key agreement is X25519 (the ``cryptography`` package is installed) or modular DH."""


def public_key(secret: int) -> bytes:
    """The public key of private key ``secret`` (a field element)."""
    if X25519:
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        return (
            X25519PrivateKey.from_private_bytes(secret.to_bytes(32, "little")).public_key().public_bytes_raw()
        )
    return pow(MODP_GENERATOR, secret, MODP_PRIME).to_bytes(256, "big")


def agree(secret: int, other: bytes) -> bytes:
    """The secret two parties share: one's private key ``secret`` with the other's public key."""
    if X25519:
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

        mine = X25519PrivateKey.from_private_bytes(secret.to_bytes(32, "little"))
        return mine.exchange(X25519PublicKey.from_public_bytes(other))
    return pow(int.from_bytes(other, "big"), secret, MODP_PRIME).to_bytes(256, "big")


# Masks ------------------------------------------------------------------------------------------


def prg(seed: bytes, d: int, bits: int) -> torch.Tensor:
    """``d`` integers uniform on ``[0, 2^bits)`` expanded from ``seed`` (a torch generator keyed by a hash
    of it; the simulation's stand-in for a cryptographic PRG)."""
    key = int.from_bytes(hashlib.blake2b(seed, digest_size=8).digest(), "little") >> 1
    gen = torch.Generator().manual_seed(key)
    return torch.randint(0, 2**bits, (d,), generator=gen, dtype=torch.int64)


def neighbours(n: int, k: int | None, rng: random.Random) -> list[frozenset[int]]:
    """Each sender's neighbours: every other sender (``k`` unset or at least ``n - 1``), else SecAgg+'s
    random ``k``-regular graph, a Harary graph (a ring, each sender joined to the ``k / 2`` nearest on
    either side) over a random order of the senders (``k`` even)."""
    if k is None or k >= n - 1:
        return [frozenset(set(range(n)) - {u}) for u in range(n)]
    if k % 2:
        raise ValueError(f"neighbours {k} must be even (a ring with k/2 on each side)")
    order = list(range(n))
    rng.shuffle(order)
    out: list[set[int]] = [set() for _ in range(n)]
    for i, u in enumerate(order):
        for step in range(1, k // 2 + 1):
            v = order[(i + step) % n]
            out[u].add(v)
            out[v].add(u)
    return [frozenset(s) for s in out]


def default_threshold(k: int) -> int:
    """A majority of a sender's ``k + 1`` holders (its neighbours and itself)."""
    return (k + 1) // 2 + 1


# The protocol -----------------------------------------------------------------------------------


class Unrecoverable(ValueError):
    """More senders dropped than the threshold lets the server unmask."""


@dataclass
class Costs:
    """What one aggregation's protocol computed: PRG coordinates each sender expanded (in order), the
    server's, key agreements each sender made and the server's, and the secrets rebuilt (each from
    ``threshold`` shares)."""

    client_coordinates: list[int] = field(default_factory=list)
    server_coordinates: int = 0
    client_agreements: list[int] = field(default_factory=list)
    server_agreements: int = 0
    reconstructions: int = 0


@dataclass
class SecAggRound:
    """One aggregation among ``n`` senders over ``d`` integers mod ``2^bits``, with each sender's
    neighbours (``k`` unset: all) and threshold ``threshold`` (unset: :func:`default_threshold`); every
    key, share coefficient and the graph are drawn from ``seed``."""

    n: int
    d: int
    bits: int
    seed: int
    k: int | None = None
    threshold: int | None = None
    graph: list[frozenset[int]] = field(init=False)
    t: int = field(init=False)
    costs: Costs = field(init=False, default_factory=Costs)

    def __post_init__(self) -> None:
        if self.n < 2:
            raise ValueError(f"secure aggregation needs at least 2 senders, got {self.n}")
        self.graph = neighbours(self.n, self.k, self._rng("graph"))
        degree = len(self.graph[0])
        self.t = default_threshold(degree) if self.threshold is None else self.threshold
        if not 1 <= self.t <= degree + 1:
            raise ValueError(f"threshold {self.t} must lie in 1..{degree + 1} (a sender's holders)")
        self._mask_keys = [self._rng("mask-key", u).randrange(1, FIELD_PRIME) for u in range(self.n)]
        self._self_seeds = [self._rng("self-mask", u).randrange(FIELD_PRIME) for u in range(self.n)]
        self._public = [public_key(s) for s in self._mask_keys]
        self._shares = [self._share(u) for u in range(self.n)]

    @property
    def degree(self) -> int:
        """Neighbours per sender (``n - 1`` on the complete graph)."""
        return len(self.graph[0])

    def _rng(self, purpose: str, *keys: int) -> random.Random:
        """The named stream of this aggregation's draws (Python integers of any size)."""
        return random.Random(derive_seed(self.seed, f"secagg-{purpose}", *keys))

    def holders(self, u: int) -> list[int]:
        """Who holds shares of ``u``'s secrets, in the order of their evaluation points."""
        return sorted(self.graph[u] | {u})

    def _share(self, u: int) -> dict[int, tuple[tuple[int, int], tuple[int, int]]]:
        """``u``'s shares of its masking key and self-mask seed, by holder."""
        rng, holders = self._rng("shares", u), self.holders(u)
        keys = shamir_share(self._mask_keys[u], self.t, len(holders), rng)
        seeds = shamir_share(self._self_seeds[u], self.t, len(holders), rng)
        return {v: (keys[i], seeds[i]) for i, v in enumerate(holders)}

    def _pairwise(self, u: int, v: int, secret: int) -> torch.Tensor:
        """The mask ``u`` adds for neighbour ``v`` (``secret`` being ``u``'s key): ``+PRG(s_uv)`` for
        ``v > u``, ``-PRG(s_uv)`` for ``v < u``."""
        mask = prg(agree(secret, self._public[v]), self.d, self.bits)
        return mask if v > u else -mask

    def _modulo(self, x: torch.Tensor) -> torch.Tensor:
        return x & (2**self.bits - 1)

    def masked(self, inputs: torch.Tensor) -> torch.Tensor:
        """Every sender's masked vector ``y_u`` (``inputs``: ``[n, d]`` integers mod ``2^bits``)."""
        if inputs.shape != (self.n, self.d):
            raise ValueError(f"inputs of shape {tuple(inputs.shape)}, expected {(self.n, self.d)}")
        out = torch.empty_like(inputs)
        costs = self.costs
        costs.client_coordinates = [(self.degree + 1) * self.d] * self.n
        costs.client_agreements = [self.degree] * self.n
        for u in range(self.n):
            y = inputs[u] + prg(self._self_seeds[u].to_bytes(32, "little"), self.d, self.bits)
            for v in self.graph[u]:
                y = self._modulo(y + self._pairwise(u, v, self._mask_keys[u]))
            out[u] = self._modulo(y)
        return out

    def check(self, dropped: Sequence[int]) -> None:
        """Refuse a dropout the survivors' shares cannot unmask: each dropped sender's key needs
        ``t`` surviving holders, each survivor's self-mask seed too."""
        gone = set(dropped)
        for u in range(self.n):
            alive = [v for v in self.holders(u) if v not in gone]
            if len(alive) < self.t:
                raise Unrecoverable(
                    f"{len(gone)} of {self.n} senders dropped: sender {u} keeps {len(alive)} surviving "
                    f"holders, fewer than the threshold {self.t}"
                )

    def unmask(self, masked: torch.Tensor, dropped: Sequence[int]) -> torch.Tensor:
        """The survivors' sum mod ``2^bits`` from their masked vectors (rows of ``masked`` of the dropped
        senders are never read): the server rebuilds each survivor's self-mask seed and each dropped
        sender's masking key from ``t`` surviving holders' shares and removes those masks."""
        self.check(dropped)
        gone = set(dropped)
        survivors = [u for u in range(self.n) if u not in gone]
        total = torch.zeros(self.d, dtype=torch.int64)
        for u in survivors:
            total = self._modulo(total + masked[u])
        costs = self.costs
        for u in range(self.n):
            alive = [v for v in self.holders(u) if v not in gone][: self.t]
            which = 1 if u not in gone else 0  # a survivor's self-mask seed, a dropped sender's key
            secret = shamir_reconstruct([self._shares[u][v][which] for v in alive])
            costs.reconstructions += 1
            if u not in gone:
                seed = secret.to_bytes(32, "little")
                total = self._modulo(total - prg(seed, self.d, self.bits))
                costs.server_coordinates += self.d
                continue
            for v in self.graph[u]:
                if v in gone:
                    continue
                # survivor v added its mask towards u: -(v's view) = +(u's view), u's key now known
                total = self._modulo(total + self._pairwise(u, v, secret))
                costs.server_coordinates += self.d
                costs.server_agreements += 1
        return total


def secagg_traffic(n: int, d: int, bits: int, k: int, t: int, dropped: int) -> dict[str, int]:
    """The protocol's bits by message kind for ``n`` senders of ``d`` coordinates at ``bits`` each, ``k``
    neighbours per sender (``n - 1``: every other), threshold ``t`` and ``dropped`` senders gone after
    masking (refused where the complete graph's survivors are fewer than ``t``):

    - ``secagg_keys``: each sender's two public keys up, and its ``k`` neighbours' pairs down;
    - ``secagg_shares``: each sender's ``k`` encrypted share pairs up, and the ``k`` meant for it down;
    - ``secagg_masked``: each survivor's masked vector, ``d * bits``;
    - ``secagg_unmask``: the survivors' list down to each survivor, and each survivor's ``k + 1``
      shares (with the owner's id) up.
    """
    survivors = n - dropped
    if survivors < t:
        raise Unrecoverable(f"{dropped} of {n} senders dropped; threshold {t} needs {t} survivors")
    return {
        "secagg_keys": n * 2 * KEY_BITS + n * k * 2 * KEY_BITS,
        "secagg_shares": 2 * n * k * CIPHER_BITS,
        "secagg_masked": survivors * d * bits,
        "secagg_unmask": survivors * survivors * ID_BITS + survivors * (k + 1) * (SHARE_BITS + ID_BITS),
    }
