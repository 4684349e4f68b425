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

The digests are computed in C (lazy_core/csrc/digest.cpp); they depend only on the values, never
on the process (no salted ``hash()``), so two runs of one program have the same keys.
"""

from __future__ import annotations

from typing import Any

from lazy_core import _native

# Process-lifetime object -> its canonical name (the C extension reads this same dict).
atoms: dict[Any, str] = {}


def register_atoms(names: dict[Any, str]) -> None:
    """Let these process-lifetime objects be part of keys, each digested as its name. A name
    never changes once registered (the C extension remembers atoms' digests by identity)."""
    for atom, name in names.items():
        if type(name) is not str:
            raise TypeError(f"an atom's name must be a str, not {type(name).__name__}")
        if atoms.setdefault(atom, name) != name:
            raise ValueError(f"{atom!r} is registered as {atoms[atom]!r} already, not {name!r}")


_native.use_atoms(atoms)
digest, digest_with = _native.digest, _native.digest_with
