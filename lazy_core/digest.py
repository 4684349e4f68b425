"""Type-exact 128-bit digests of IR values: what node, graph and memo keys are made of.

Python's ``hash()`` and ``==`` conflate values a program tells apart (``hash(-1) == hash(-2)``,
``8 == 8.0``, ``True == 1``, ``0.0 == -0.0``), so a key built from them can make two different
programs share an executable or a memo entry. A digest instead hashes a canonical serialization
in which every value carries its type: a stream of 64-bit words (a tag, then the value's bits;
strings and bytes with their length; tuples with their length and, for a tuple subclass such as
``Operand``, the type's name), folded by two independent multiply-rotate lanes into 128 bits.
Equal digests mean equal values with overwhelming probability; no two values that compare equal
but differ in type or sign ever get the same stream.

Objects that live for the whole process and have no value to serialize (a framework's dtype
objects, Python's number types) enter as atoms: ``register_atoms`` names them, and an atom
enters as the digest of its name. A node enters its parent's key as its digest, and so does a
node's ``arg`` in the node's own digest, so a template digested once (for the shape memo) need
not be walked again for its node.

The C extension (lazy_core/csrc/digest.cpp) computes the same digests; this is its twin.
"""

from __future__ import annotations

import struct
from typing import Any

_M = (1 << 64) - 1
P1, P2, P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
P4, P5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5
(T_NONE, T_BOOL, T_INT, T_BIGINT, T_FLOAT, T_COMPLEX, T_STR, T_BYTES, T_TUPLE, T_SUBTUPLE,
 T_ATOM, T_NODE, T_GRAPH, T_DIGEST) = range(1, 15)  # fmt: skip

# Process-lifetime object -> its canonical name (the C extension reads this same dict).
atoms: dict[Any, str] = {}


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _avalanche(x: int) -> int:
    x ^= x >> 33
    x = x * P2 & _M
    x ^= x >> 29
    x = x * P3 & _M
    return x ^ (x >> 32)


class Hasher:
    """The word stream's two lanes; ``done()`` gives the digest as an int below 2**128."""

    __slots__ = ("a", "b", "n")

    def __init__(self) -> None:
        self.a, self.b, self.n = 0x243F6A8885A308D3, 0x13198A2E03707344, 0

    def add(self, w: int) -> None:
        w &= _M
        self.a = _rotl((self.a + w * P2) & _M, 31) * P1 & _M
        self.b = (_rotl(self.b ^ (w * P4 & _M), 27) * P3 + P5) & _M
        self.n += 1

    def done(self) -> int:
        x = _avalanche((self.a + _rotl(self.b, 23) + self.n * P5) & _M)
        y = _avalanche(self.b ^ x ^ (self.n * P1 & _M))
        return x | y << 64

    def add_bytes(self, tag: int, data: bytes) -> None:
        self.add(tag)
        self.add(len(data))
        for i in range(0, len(data), 8):
            self.add(int.from_bytes(data[i : i + 8], "little"))

    def absorb(self, v: Any, depth: int = 0) -> None:
        """Feed ``v``'s type-exact serialization."""
        if depth > 200:
            raise TypeError("lazy_core digest: value nested too deeply")
        t = type(v)
        if v is None:
            self.add(T_NONE)
        elif t is bool:
            self.add(T_BOOL)
            self.add(int(v))
        elif t is int:
            if -(1 << 63) <= v < 1 << 63:
                self.add(T_INT)
                self.add(v)
            else:
                limbs, m = [], abs(v)
                while m:
                    limbs.append(m & _M)
                    m >>= 64
                for w in (T_BIGINT, int(v < 0), len(limbs), *limbs):
                    self.add(w)
        elif t is float:
            self.add(T_FLOAT)
            self.add(_bits(v))
        elif t is complex:
            for w in (T_COMPLEX, _bits(v.real), _bits(v.imag)):
                self.add(w)
        elif t is str:
            self.add_bytes(T_STR, v.encode("utf-8", "surrogatepass"))
        elif t is bytes:
            self.add_bytes(T_BYTES, v)
        elif isinstance(v, tuple):
            if t is tuple:
                self.add(T_TUPLE)
            else:
                self.add_bytes(T_SUBTUPLE, t.__name__.encode())
            self.add(len(v))
            for item in v:
                self.absorb(item, depth + 1)
        else:
            try:
                name = atoms.get(v)
            except TypeError:  # unhashable: not an atom
                name = None
            if type(name) is not str:
                raise TypeError(
                    f"lazy_core digest: a value of type {t.__module__}.{t.__qualname__} cannot be "
                    "part of an IR key (numbers, strings, bytes, None, tuples and registered "
                    "atoms can)"
                )
            self.add(T_ATOM)
            self.add_digest(py_digest(name))

    def add_digest(self, d: int) -> None:
        self.add(d & _M)
        self.add(d >> 64)


def _bits(d: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", d))[0]


def py_digest(v: Any) -> int:
    """The type-exact digest of ``v`` (an int below 2**128); ``digest`` is the C one when built."""
    h = Hasher()
    h.absorb(v)
    return h.done()


def py_digest_with(d: int, v: Any) -> int:
    """Digest ``d`` extended by ``v`` (a key made of a digest already known and more values);
    ``digest_with`` is the C one when built."""
    h = Hasher()
    h.add(T_DIGEST)
    h.add_digest(d)
    h.absorb(v)
    return h.done()


def register_atoms(names: dict[Any, str]) -> None:
    """Let these process-lifetime objects be part of keys, each digested as its name. A name
    never changes once registered (the C extension remembers atoms' digests by identity)."""
    for atom, name in names.items():
        if type(name) is not str:
            raise TypeError(f"an atom's name must be a str, not {type(name).__name__}")
        if atoms.setdefault(atom, name) != name:
            raise ValueError(f"{atom!r} is registered as {atoms[atom]!r} already, not {name!r}")


try:
    from lazy_core import _native
except ImportError:
    _native = None
if _native is not None:
    _native.use_atoms(atoms)
    digest, digest_with = _native.digest, _native.digest_with
else:
    digest, digest_with = py_digest, py_digest_with
