// Type-exact 128-bit digests of IR values (lazy_core/digest.py documents the serialization):
// what node, graph and memo keys are made of, so that values Python's hash() and == conflate
// (-1 and -2, 8 and 8.0, True and 1, 0.0 and -0.0) never share a key.
#include "native.h"

#include <cstring>
#include <unordered_map>
#include <vector>

namespace lazy_native {

namespace {

PyObject* atoms = nullptr;  // digest.py's dict: process-lifetime object -> its canonical name
// Atoms' name digests by identity: the dict holds its atoms for the whole process and a name
// never changes once registered (digest.py), so an address stays the same atom.
std::unordered_map<PyObject*, Digest> atom_digests;

uint64_t bits_of(double d) {
    uint64_t u;
    std::memcpy(&u, &d, sizeof u);
    return u;
}

void add_bytes(Hasher& h, uint64_t tag, const char* data, Py_ssize_t n) {
    static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "words are read little-endian");
    h.add(tag);
    h.add((uint64_t)n);
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, data + i, 8);
        h.add(w);
    }
    if (i < n) {
        uint64_t w = 0;
        std::memcpy(&w, data + i, (size_t)(n - i));
        h.add(w);
    }
}

bool add_str(Hasher& h, uint64_t tag, PyObject* s) {
    Py_ssize_t n;
    const char* data = PyUnicode_AsUTF8AndSize(s, &n);
    if (data == nullptr) return false;
    add_bytes(h, tag, data, n);
    return true;
}

// An int outside int64: its sign, then its magnitude's 64-bit limbs from the lowest.
bool add_bigint(Hasher& h, PyObject* v) {
    Ref zero(PyLong_FromLong(0)), shift(PyLong_FromLong(64));
    if (!zero || !shift) return false;
    int negative = PyObject_RichCompareBool(v, zero.p, Py_LT);
    if (negative < 0) return false;
    Ref m(PyNumber_Absolute(v));
    if (!m) return false;
    std::vector<uint64_t> limbs;
    for (;;) {
        int done = PyObject_RichCompareBool(m.p, zero.p, Py_EQ);
        if (done < 0) return false;
        if (done) break;
        limbs.push_back(PyLong_AsUnsignedLongLongMask(m.p));
        if (PyErr_Occurred()) return false;
        Py_SETREF(m.p, PyNumber_Rshift(m.p, shift.p));
        if (!m) return false;
    }
    h.add(TAG_BIGINT);
    h.add((uint64_t)negative);
    h.add((uint64_t)limbs.size());
    for (uint64_t w : limbs) h.add(w);
    return true;
}

bool absorb_at(Hasher& h, PyObject* v, int depth) {
    if (depth > 200) {
        PyErr_SetString(PyExc_TypeError, "lazy_core digest: value nested too deeply");
        return false;
    }
    PyTypeObject* t = Py_TYPE(v);
    if (v == Py_None) {
        h.add(TAG_NONE);
    } else if (t == &PyBool_Type) {
        h.add(TAG_BOOL);
        h.add(v == Py_True);
    } else if (t == &PyLong_Type) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (x == -1 && PyErr_Occurred()) return false;
        if (overflow) return add_bigint(h, v);
        h.add(TAG_INT);
        h.add((uint64_t)x);
    } else if (t == &PyFloat_Type) {
        h.add(TAG_FLOAT);
        h.add(bits_of(PyFloat_AS_DOUBLE(v)));
    } else if (t == &PyComplex_Type) {
        Py_complex c = PyComplex_AsCComplex(v);
        h.add(TAG_COMPLEX);
        h.add(bits_of(c.real));
        h.add(bits_of(c.imag));
    } else if (t == &PyUnicode_Type) {
        return add_str(h, TAG_STR, v);
    } else if (t == &PyBytes_Type) {
        add_bytes(h, TAG_BYTES, PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v));
    } else if (PyTuple_Check(v)) {
        if (t == &PyTuple_Type) {
            h.add(TAG_TUPLE);
        } else {  // Operand markers, foreach Elements: the type's name tells them apart
            const char* name = t->tp_name;
            const char* dot = std::strrchr(name, '.');
            if (dot != nullptr) name = dot + 1;
            add_bytes(h, TAG_SUBTUPLE, name, (Py_ssize_t)std::strlen(name));
        }
        Py_ssize_t n = PyTuple_GET_SIZE(v);
        h.add((uint64_t)n);
        for (Py_ssize_t i = 0; i < n; i++)
            if (!absorb_at(h, PyTuple_GET_ITEM(v, i), depth + 1)) return false;
    } else {
        auto known = atom_digests.find(v);
        if (known == atom_digests.end()) {
            PyObject* name = atoms == nullptr ? nullptr : PyDict_GetItemWithError(atoms, v);
            if (name == nullptr && PyErr_Occurred()) PyErr_Clear();  // unhashable: not an atom
            if (name == nullptr || !PyUnicode_CheckExact(name)) {
                PyErr_Format(PyExc_TypeError,
                             "lazy_core digest: a value of type %s cannot be part of an IR key "
                             "(numbers, strings, bytes, None, tuples and registered atoms can)",
                             t->tp_name);
                return false;
            }
            Hasher named;
            if (!add_str(named, TAG_STR, name)) return false;
            known = atom_digests.emplace(v, named.done()).first;
        }
        h.add(TAG_ATOM);
        h.add(known->second.lo);
        h.add(known->second.hi);
    }
    return true;
}

// digest(value) -> int (lazy_core/digest.py).
PyObject* py_digest(PyObject*, PyObject* v) {
    Digest d;
    return digest_of(v, d) ? digest_int(d) : nullptr;
}

// digest_with(digest, value) -> int: a digest extended by a value.
PyObject* py_digest_with(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 2 || !PyLong_CheckExact(argv[0])) {
        PyErr_SetString(PyExc_TypeError, "digest_with(digest: int, value)");
        return nullptr;
    }
    unsigned char bytes[16];
    if (_PyLong_AsByteArray((PyLongObject*)argv[0], bytes, 16, 1, 0) < 0) return nullptr;
    Digest d;
    for (int i = 0; i < 8; i++) {
        d.lo |= (uint64_t)bytes[i] << (8 * i);
        d.hi |= (uint64_t)bytes[8 + i] << (8 * i);
    }
    Hasher h;
    h.add(TAG_DIGEST);
    h.add(d.lo);
    h.add(d.hi);
    if (!absorb(h, argv[1])) return nullptr;
    return digest_int(h.done());
}

// use_atoms(dict): digests read atoms' names from this dict (lazy_core/digest.py's) from now on.
PyObject* use_atoms(PyObject*, PyObject* d) {
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "use_atoms(dict)");
        return nullptr;
    }
    Py_INCREF(d);
    Py_XSETREF(atoms, d);
    atom_digests.clear();
    Py_RETURN_NONE;
}

PyMethodDef digest_methods[] = {
    {"digest", (PyCFunction)py_digest, METH_O,
     "digest(value) -> int: the type-exact 128-bit digest of an IR value (lazy_core/digest.py)."},
    {"digest_with", (PyCFunction)(void (*)(void))py_digest_with, METH_FASTCALL,
     "digest_with(digest, value) -> int: a digest extended by a value (lazy_core/digest.py)."},
    {"use_atoms", (PyCFunction)use_atoms, METH_O,
     "use_atoms(dict): the atoms' names (object -> str) digests read."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

bool absorb(Hasher& h, PyObject* v) { return absorb_at(h, v, 0); }

bool digest_of(PyObject* v, Digest& out) {
    Hasher h;
    if (!absorb(h, v)) return false;
    out = h.done();
    return true;
}

PyObject* digest_int(const Digest& d) {
    unsigned char bytes[16];
    for (int i = 0; i < 8; i++) {
        bytes[i] = (unsigned char)(d.lo >> (8 * i));
        bytes[8 + i] = (unsigned char)(d.hi >> (8 * i));
    }
    return _PyLong_FromByteArray(bytes, 16, /*little_endian=*/1, /*is_signed=*/0);
}

bool add_digests(PyObject* module) { return PyModule_AddFunctions(module, digest_methods) == 0; }

}  // namespace lazy_native
