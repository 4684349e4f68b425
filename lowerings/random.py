"""Lowerings: random ops, drawing from ``ctx.rng_key`` (derived from the device RNG state).

The device RNG state is a byte vector (uint8): the raw data of a PRNG key, then a uint32 counter.
Bytes let it travel as a plain byte tensor (``torch.lazy.get_rng_state()``, as CUDA's state is).
The ``index``-th random op drawn from a state uses key ``fold_in(key, counter + index)``. Skipping
``n`` draws adds ``n`` to the counter and keeps the key, so a state taken in the middle of a step
and restored later draws what the step itself drew there (checkpoint's recomputation); a barrier
re-keys (``lazy.rng_advance``), so the counter only counts the draws since the last one.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lowerings.dtypes import astype, cast
from lowerings.registry import lowering


def _pack(key_data, counter):
    words = jnp.concatenate([jnp.reshape(key_data, (-1,)).astype(jnp.uint32), counter[None]])
    return jnp.reshape(lax.bitcast_convert_type(words, jnp.uint8), (-1,))


def _unpack(state):
    words = lax.bitcast_convert_type(jnp.reshape(state, (-1, 4)), jnp.uint32)
    return jax.random.wrap_key_data(words[:-1]), words[-1]


def initial_state(seed: int) -> np.ndarray:
    """The RNG state after seeding with ``seed`` (any int; taken modulo 2**64), as host bytes."""
    seed %= 1 << 64
    key = jax.random.key(seed - (1 << 64) if seed >= 1 << 63 else seed)
    return np.asarray(_pack(jax.random.key_data(key), jnp.zeros((), jnp.uint32)))


def rng_key(state, index: int):
    """The PRNG key of the ``index``-th random op drawn from ``state``."""
    key, counter = _unpack(state)
    return jax.random.fold_in(key, counter + jnp.uint32(index))


@lowering("lazy.rng_skip")
def _rng_skip(ctx, state, draws):
    key, counter = _unpack(state)
    return _pack(jax.random.key_data(key), counter + jnp.uint32(draws))


@lowering("lazy.rng_advance")
def _rng_advance(ctx, state, draws):
    return _pack(jax.random.key_data(rng_key(state, draws)), jnp.zeros((), jnp.uint32))


def _float_dtype(dtype):
    return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.float32


def _uniform(ctx, low=0.0, high=1.0):
    # Sample in at least float32: bfloat16 uniforms straight from bits are too coarse.
    dt = jnp.promote_types(_float_dtype(ctx.dtype), jnp.float32)
    u = jax.random.uniform(ctx.rng_key, ctx.shape, dt)
    return u * (cast(high, dt) - cast(low, dt)) + cast(low, dt)


def _below(x, high, low):
    """``x`` cast to a float dtype narrower than it was drawn in can round up to ``high``; keep
    it in the half-open range as PyTorch does."""
    high = cast(high, x.dtype)
    return jnp.where(x >= high, jnp.nextafter(high, cast(low, x.dtype)), x)


@lowering("aten.uniform_.default", "aten.uniform.default")
def _uniform_op(ctx, self=None, from_=0.0, to=1.0, *, generator=None, **kw):
    low = kw.get("from", from_)
    out = _uniform(ctx, low, to).astype(ctx.dtype)
    return _below(out, to, low) if ctx.dtype.itemsize < 4 else out


@lowering("aten.rand_like.default", "aten.rand_like.generator")
def _rand_like(ctx, self, **_):
    out = _uniform(ctx).astype(ctx.dtype)
    return _below(out, 1.0, 0.0) if ctx.dtype.itemsize < 4 else out


def _standard_normal(ctx):
    dt = jnp.promote_types(_float_dtype(ctx.dtype), jnp.float32)
    return jax.random.normal(ctx.rng_key, ctx.shape, dt)


@lowering("aten.randn_like.default", "aten.randn_like.generator")
def _randn_like(ctx, self, **_):
    return _standard_normal(ctx).astype(ctx.dtype)


@lowering("aten.normal_.default")
def _normal_(ctx, self=None, mean=0.0, std=1.0, *, generator=None):
    z = _standard_normal(ctx)
    return (z * cast(std, z.dtype) + cast(mean, z.dtype)).astype(ctx.dtype)


@lowering(
    "aten.normal.Tensor_float",
    "aten.normal.float_Tensor",
    "aten.normal.Tensor_Tensor",
    "aten.normal.float_float",
)
def _normal(ctx, mean=0.0, std=1.0, size=None, *, generator=None, **_):
    z = _standard_normal(ctx)
    return (z * cast(std, z.dtype) + cast(mean, z.dtype)).astype(ctx.dtype)


@lowering("aten.bernoulli_.float", "aten.bernoulli.p")
def _bernoulli_p(ctx, self=None, p=0.5, *, generator=None):
    return astype(_uniform(ctx) < cast(p, jnp.float32), ctx.dtype)


@lowering("aten.bernoulli_.Tensor", "aten.bernoulli.Tensor")
def _bernoulli_t(ctx, self, p, *, generator=None):
    return astype(_uniform(ctx) < p.astype(jnp.float32), ctx.dtype)


@lowering("aten.bernoulli.default")
def _bernoulli(ctx, self, *, generator=None):
    return astype(_uniform(ctx) < self.astype(jnp.float32), ctx.dtype)


@lowering("aten.exponential_.default")
def _exponential(ctx, self=None, lambd=1.0, *, generator=None):
    dt = jnp.promote_types(_float_dtype(ctx.dtype), jnp.float32)
    e = jax.random.exponential(ctx.rng_key, ctx.shape, dt)
    return (e / cast(lambd, dt)).astype(ctx.dtype)


@lowering("aten.geometric_.default")
def _geometric(ctx, self, p, *, generator=None):
    # Number of Bernoulli(p) trials up to the first success: ceil(log(U) / log(1 - p)), U in (0, 1].
    u = 1.0 - jax.random.uniform(ctx.rng_key, ctx.shape, jnp.float64)
    p = cast(p, jnp.float64)
    return jnp.maximum(jnp.ceil(jnp.log(u) / jnp.log1p(-p)), 1.0).astype(ctx.dtype)


def _int_bounds(ctx, low, high):
    if high is None:
        if ctx.dtype == jnp.bool_:
            return 0, 2
        if jnp.issubdtype(ctx.dtype, jnp.floating):
            # PyTorch draws integers up to 2**mantissa bits for floating dtypes.
            return 0, 2 ** (jnp.finfo(ctx.dtype).nmant + 1) + 1
        return 0, jnp.iinfo(ctx.dtype).max
    return low, high


def _randint(ctx, low, high):
    low, high = _int_bounds(ctx, low, high)
    draw = jax.random.randint(
        ctx.rng_key, ctx.shape, cast(low, jnp.int64), cast(high, jnp.int64), jnp.int64
    )
    return draw.astype(ctx.dtype)


@lowering("aten.random_.default")
def _random(ctx, self=None, *, generator=None):
    return _randint(ctx, 0, None)


@lowering("aten.random_.to")
def _random_to(ctx, self, to, *, generator=None):
    return _randint(ctx, 0, to)


@lowering("aten.random_.from")
def _random_from(ctx, self, from_, to=None, *, generator=None):
    return _randint(ctx, from_, to)


@lowering(
    "aten.randint_like.default",
    "aten.randint_like.generator",
    "aten.randint_like.Tensor",
    "aten.randint_like.Tensor_generator",
)
def _randint_like(ctx, self, high, **_):
    return _randint(ctx, 0, high)


@lowering("aten.randint_like.low_dtype", "aten.randint_like.low_generator_dtype")
def _randint_like_low(ctx, self, low, high, **_):
    return _randint(ctx, low, high)


@lowering("aten.randperm.default", "aten.randperm.generator")
def _randperm(ctx, n, **_):
    return jax.random.permutation(ctx.rng_key, n).astype(ctx.dtype)


@lowering("aten.multinomial.default")
def _multinomial(ctx, self, num_samples, replacement=False, *, generator=None):
    p = self.astype(jnp.promote_types(self.dtype, jnp.float32))
    if not replacement:
        # Gumbel-top-k: the k largest of log(p) + Gumbel noise are k draws without replacement,
        # in draw order; zero-probability categories get -inf and are never among them.
        gumbel = jax.random.gumbel(ctx.rng_key, p.shape, p.dtype)
        keys = jnp.where(p > 0, jnp.log(jnp.where(p > 0, p, 1)) + gumbel, -jnp.inf)
        return jax.lax.top_k(keys, num_samples)[1]
    # Inverse CDF, as eager does: the first category whose cumulative weight exceeds u * total.
    # A zero-probability category repeats its predecessor's cumulative weight, so it is never
    # the first to exceed anything; a draw rounded up to the total goes to the last category
    # with positive weight.
    cdf = jnp.cumsum(p, axis=-1)
    u = jax.random.uniform(ctx.rng_key, ctx.shape, p.dtype) * cdf[..., -1:]
    draw = partial(jnp.searchsorted, side="right")
    index = draw(cdf, u) if p.ndim == 1 else jax.vmap(draw)(cdf, u)
    k = p.shape[-1]
    last = k - 1 - jnp.argmax(jnp.flip(p > 0, axis=-1), axis=-1)
    return jnp.minimum(index, last[..., None]).astype(ctx.dtype)


@lowering("aten.rrelu_with_noise_functional.default")
def _rrelu_with_noise(ctx, self, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    # Training mode only (evaluation is a leaky ReLU, recorded as one): a negative input is
    # scaled by a fresh U(lower, upper) slope, which is also the noise saved for backward.
    slope = _uniform(ctx, lower, upper).astype(ctx.dtype)
    negative = self <= 0
    out = jnp.where(negative, self * slope, self)
    return out, jnp.where(negative, slope, jnp.ones((), ctx.dtype)).astype(ctx.dtypes[1])


@lowering("aten.native_dropout.default")
def _native_dropout(ctx, input, p, train):
    if train is False:
        return input, jnp.ones(ctx.shapes[1], jnp.bool_)
    keep = _uniform(ctx) >= p
    scale = 1.0 / (1.0 - p) if p < 1 else 0.0
    # Eager multiplies by the mask, so a dropped inf or nan is nan there too (a select gives 0).
    out = input * astype(keep, input.dtype) * jnp.asarray(scale, input.dtype)
    return out, keep
