"""The suite's MLP and GPT-2 written directly in JAX: jitted steps that set the ceiling for lazy.

Same architecture and optimizer math as the PyTorch workloads of ``benchmarks/suite.py`` (SGD for
the MLP; AdamW with PyTorch's defaults for GPT-2), not the same initial values. float32 matmuls run
at ``Precision.HIGHEST`` as PyTorch's do; with ``amp=True`` matmul inputs are cast to bfloat16
(as CUDA autocast does) and softmax, layer norm and the loss stay in float32.

>>> import numpy as np
>>> m = mlp(np.zeros((4, 256), np.float32), np.zeros(4, np.int64))
>>> state, loss = m.train_step(m.init(), m.batch)
>>> m.infer_step(state[0], m.batch).shape
(4, 10)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

F32 = jnp.float32  # explicit everywhere: lowerings turn jax_enable_x64 on for the whole process


@dataclasses.dataclass
class JaxWorkload:
    """``train_step(state, batch) -> (state, loss)`` donates ``state = (params, opt_state)``;
    ``infer_step(params, batch) -> output``; ``init()`` makes a fresh state on ``device``."""

    init: Callable[[], Any]
    train_step: Callable
    infer_step: Callable
    batch: Any


def _matmul(a: jax.Array, b: jax.Array, amp: bool) -> jax.Array:
    if amp:
        return jnp.matmul(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16))
    return jnp.matmul(a, b, precision=lax.Precision.HIGHEST)


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits.astype(F32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


def _normal(key: jax.Array, shape: tuple[int, ...], std: float) -> jax.Array:
    return jax.random.normal(key, shape, F32) * std


def _pair(params, init_opt):
    return params, init_opt(params)


def _workload(init_params, init_opt, loss_fn, update, infer_fn, batch, device) -> JaxWorkload:
    def train_step(state, batch):
        params, opt = state
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return update(params, grads, opt), loss

    batch = jax.device_put(batch, device)
    return JaxWorkload(
        init=lambda: jax.device_put(_pair(init_params(), init_opt), device),
        train_step=jax.jit(train_step, donate_argnums=0),
        infer_step=jax.jit(infer_fn),
        batch=batch,
    )


# ----------------------------------------------------------------------------------------------
# MLP 256-512-512-10, ReLU, SGD.


def mlp(
    x: np.ndarray, y: np.ndarray, lr: float = 0.01, amp: bool = False, device: Any = None
) -> JaxWorkload:
    sizes = [(256, 512), (512, 512), (512, 10)]

    def init_params():
        keys = jax.random.split(jax.random.key(0), len(sizes))
        return [
            {"w": _normal(k, (i, o), 1 / math.sqrt(i)), "b": jnp.zeros(o, F32)}
            for k, (i, o) in zip(keys, sizes)
        ]

    def forward(params, batch):
        h = batch[0]
        for n, layer in enumerate(params):
            h = _matmul(h, layer["w"], amp) + layer["b"]
            if n < len(params) - 1:
                h = jax.nn.relu(h)
        return h

    def loss_fn(params, batch):
        return _cross_entropy(forward(params, batch), batch[1])

    def sgd(params, grads, opt):
        return jax.tree.map(lambda p, g: p - lr * g, params, grads), opt

    return _workload(init_params, lambda params: (), loss_fn, sgd, forward, (x, y), device)


# ----------------------------------------------------------------------------------------------
# GPT-2 (transformers' GPT2LMHeadModel): learned positions, pre-LN blocks, causal attention,
# gelu_new, final LayerNorm, LM head tied to the token embedding; AdamW.


@dataclasses.dataclass(frozen=True)
class GPT2Config:
    vocab: int = 8192
    positions: int = 128
    dim: int = 256
    layers: int = 4
    heads: int = 4
    eps: float = 1e-5


def _layer_norm(x: jax.Array, p: dict, eps: float) -> jax.Array:
    x = x.astype(F32)
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * p["g"] + p["b"]


def _gpt2_params(cfg: GPT2Config) -> dict:
    d = cfg.dim
    keys = iter(jax.random.split(jax.random.key(0), 2 + 4 * cfg.layers))
    proj_std = 0.02 / math.sqrt(2 * cfg.layers)

    def ln():
        return {"g": jnp.ones(d, F32), "b": jnp.zeros(d, F32)}

    def dense(i, o, std):
        return {"w": _normal(next(keys), (i, o), std), "b": jnp.zeros(o, F32)}

    blocks = [
        {
            "ln1": ln(),
            "qkv": dense(d, 3 * d, 0.02),
            "proj": dense(d, d, proj_std),
            "ln2": ln(),
            "fc": dense(d, 4 * d, 0.02),
            "out": dense(4 * d, d, proj_std),
        }
        for _ in range(cfg.layers)
    ]
    return {
        "wte": _normal(next(keys), (cfg.vocab, d), 0.02),
        "wpe": _normal(next(keys), (cfg.positions, d), 0.01),
        "blocks": blocks,
        "ln_f": ln(),
    }


def _attention(x: jax.Array, blk: dict, cfg: GPT2Config, amp: bool) -> jax.Array:
    b, t, d = x.shape
    hd = d // cfg.heads
    qkv = _matmul(x, blk["qkv"]["w"], amp) + blk["qkv"]["b"]
    q, k, v = (a.reshape(b, t, cfg.heads, hd).transpose(0, 2, 1, 3) for a in jnp.split(qkv, 3, -1))
    scores = _matmul(q, k.transpose(0, 1, 3, 2), amp).astype(F32) / math.sqrt(hd)
    causal = jnp.tril(jnp.ones((t, t), bool))
    scores = jnp.where(causal, scores, jnp.finfo(F32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    out = _matmul(probs, v, amp).transpose(0, 2, 1, 3).reshape(b, t, d)
    return _matmul(out, blk["proj"]["w"], amp) + blk["proj"]["b"]


def _gpt2_logits(params: dict, ids: jax.Array, cfg: GPT2Config, amp: bool) -> jax.Array:
    t = ids.shape[1]
    h = params["wte"][ids] + params["wpe"][:t]
    for blk in params["blocks"]:
        h = h + _attention(_layer_norm(h, blk["ln1"], cfg.eps), blk, cfg, amp)
        a = _matmul(_layer_norm(h, blk["ln2"], cfg.eps), blk["fc"]["w"], amp) + blk["fc"]["b"]
        h = h + _matmul(jax.nn.gelu(a, approximate=True), blk["out"]["w"], amp) + blk["out"]["b"]
    h = _layer_norm(h, params["ln_f"], cfg.eps)
    return _matmul(h, params["wte"].T, amp)


def adamw(
    lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, wd: float = 0.01
) -> tuple[Callable, Callable]:
    """PyTorch's ``torch.optim.AdamW`` (decoupled decay, bias corrections); returns
    ``(init(params) -> state, update(params, grads, state) -> (params, state))``."""
    b1, b2 = betas

    def init(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return {"step": jnp.zeros((), F32), "m": zeros, "v": jax.tree.map(jnp.copy, zeros)}

    def update(params, grads, state):
        step = state["step"] + 1
        step_size = lr / (1 - b1**step)
        sqrt_c2 = jnp.sqrt(1 - b2**step)
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)

        def one(p, m, v):
            p = p * (1 - lr * wd)
            return p - step_size * m / (jnp.sqrt(v) / sqrt_c2 + eps)

        return jax.tree.map(one, params, m, v), {"step": step, "m": m, "v": v}

    return init, update


def gpt2(
    ids: np.ndarray,
    cfg: GPT2Config = GPT2Config(),
    lr: float = 1e-4,
    amp: bool = False,
    device: Any = None,
) -> JaxWorkload:
    """Loss as ``GPT2LMHeadModel(input_ids=ids, labels=ids)``: logits of positions 0..t-2
    against tokens 1..t-1; inference returns the logits."""
    opt_init, opt_update = adamw(lr)

    def loss_fn(params, ids):
        logits = _gpt2_logits(params, ids, cfg, amp)
        return _cross_entropy(logits[:, :-1], ids[:, 1:])

    def infer(params, ids):
        return _gpt2_logits(params, ids, cfg, amp)

    return _workload(lambda: _gpt2_params(cfg), opt_init, loss_fn, opt_update, infer, ids, device)
