"""Random lowerings: factories (rand, randn, randint, randperm, normal), in-place fills
(uniform_, normal_, bernoulli_, exponential_, ...), multinomial and dropout.

Every op is registered with ``random=True`` and draws from ``rng_key()``, a fresh key
per call derived from the device generator (``torch.manual_seed`` resets it). A torch
``Generator`` argument is accepted and ignored: the device generator is the source.
Half types draw in float32 and round, as torch's CPU kernels do.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tpu_kernels.registry.context import check, out_dtype, out_shape, rng_key
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import float_compute


def _rand_dtype():
    return float_compute(out_dtype()) if jnp.issubdtype(out_dtype(), jnp.floating) else jnp.float32


def _uniform(low=None, high=None):
    """Uniform floats in [low, high) (default [0, 1)) of the output's shape."""
    if low is None:  # draw in the output's float type itself: rounding never reaches 1
        dt = out_dtype() if jnp.issubdtype(out_dtype(), jnp.floating) else jnp.float32
        return jax.random.uniform(rng_key(), out_shape(), dt)
    u = jax.random.uniform(rng_key(), out_shape(), _rand_dtype())
    return low + (high - low) * u


def _bernoulli(p):
    """Bernoulli(p) draws, compared in float32 (or float64) whatever the output type."""
    return jax.random.uniform(rng_key(), out_shape(), _rand_dtype()) < p


def _normal(mean=0.0, std=1.0):
    dt = _rand_dtype()
    return mean + std * jax.random.normal(rng_key(), out_shape(), dt)


def _randint(low: int, high: int) -> jax.Array:
    return jax.random.randint(rng_key(), out_shape(), low, high, jnp.int64)


def _out(x):
    return x.astype(out_dtype())


# -- factories ---------------------------------------------------------------------------
@xla("aten::rand", "aten::rand.generator", "aten::rand_like", random=True)
def rand(*args, **kwargs):
    return _out(_uniform())


@xla("aten::randn", "aten::randn.generator", "aten::randn_like", random=True)
def randn(*args, **kwargs):
    return _out(_normal())


@xla("aten::randint", "aten::randint.generator", random=True)
def randint(high, size, **kwargs):
    return _out(_randint(0, high))


@xla("aten::randint.low", "aten::randint.low_generator", random=True)
def randint_low(low, high, size, **kwargs):
    return _out(_randint(low, high))


@xla("aten::randint_like", random=True)
def randint_like(self, high, **kwargs):
    return _out(_randint(0, high))


@xla("aten::randint_like.low_dtype", random=True)
def randint_like_low(self, low, high, **kwargs):
    return _out(_randint(low, high))


@xla("aten::randperm", "aten::randperm.generator", random=True)
def randperm(n, **kwargs):
    return _out(jax.random.permutation(rng_key(), n))


@xla("aten::normal.float_float", random=True)
def normal_float_float(mean, std, size, **kwargs):
    return _out(_normal(mean, std))


@xla("aten::normal.Tensor_float", "aten::normal.float_Tensor", "aten::normal.Tensor_Tensor",
     random=True)
def normal_tensor(mean, std=1.0, *, generator=None):
    return _out(_normal(mean, std))


# -- fills: one function serves the functional op and its in-place twin ------------------
@xla("aten::uniform", "aten::uniform_", random=True)
def uniform(self, low=0.0, high=1.0, *, generator=None):
    return _out(_uniform(low, high))


@xla("aten::normal_", "aten::normal_functional", random=True)
def normal_(self, mean=0.0, std=1.0, *, generator=None):
    return _out(_normal(mean, std))


@xla("aten::exponential", "aten::exponential_", random=True)
def exponential(self, lambd=1.0, *, generator=None):
    return _out(jax.random.exponential(rng_key(), out_shape(), _rand_dtype()) / lambd)


@xla("aten::geometric", "aten::geometric_", random=True)
def geometric(self, p, *, generator=None):
    """Trials until the first success (support 1, 2, ...): ceil(log U / log(1 - p))."""
    dt = _rand_dtype()
    u = jax.random.uniform(rng_key(), out_shape(), dt, minval=jnp.finfo(dt).tiny)
    return _out(jnp.maximum(jnp.ceil(jnp.log(u) / jnp.log1p(-p)), 1))


@xla("aten::log_normal", "aten::log_normal_", random=True)
def log_normal(self, mean=1.0, std=2.0, *, generator=None):
    return _out(jnp.exp(_normal(mean, std)))


@xla("aten::cauchy", "aten::cauchy_", random=True)
def cauchy(self, median=0.0, sigma=1.0, *, generator=None):
    return _out(median + sigma * jax.random.cauchy(rng_key(), out_shape(), _rand_dtype()))


def _random_bound(dtype) -> int:
    """torch's default upper bound (inclusive) of random_: the largest exactly
    representable consecutive integer for floats, the max for integers."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return 1
    if jnp.issubdtype(dtype, jnp.floating):
        return 2 ** (jnp.finfo(dtype).nmant + 1)
    return int(jnp.iinfo(dtype).max)


@xla("aten::random", "aten::random_", random=True)
def random_(self, *, generator=None):
    return _out(_randint_inclusive(0, _random_bound(self.dtype)))


@xla("aten::random.from", "aten::random_.from", random=True)
def random_from(self, low, high, *, generator=None):
    if high is None:
        return _out(_randint_inclusive(low, _random_bound(self.dtype)))
    return _out(_randint(low, high))


@xla("aten::random.to", "aten::random_.to", random=True)
def random_to(self, high, *, generator=None):
    return _out(_randint(0, high))


def _randint_inclusive(low: int, high: int) -> jax.Array:
    top = np.iinfo(np.int64).max
    return _randint(low, high + 1 if high < top else top)


# -- bernoulli and dropout -------------------------------------------------------------------
@xla("aten::bernoulli", random=True)
def bernoulli(self, *, generator=None):
    return _out(_bernoulli(self))


@xla("aten::bernoulli.p", "aten::bernoulli_.float", random=True)
def bernoulli_p(self, p=0.5, *, generator=None):
    return _out(_bernoulli(p))


@xla("aten::bernoulli.Tensor", "aten::bernoulli_.Tensor", random=True)
def bernoulli_tensor(self, p, *, generator=None):
    return _out(_bernoulli(p))


@xla("aten::native_dropout", random=True)
def native_dropout(input, p, train):
    """(input * mask / (1 - p), mask) with mask ~ Bernoulli(1 - p); p = 1 drops everything."""
    if train is not None and not train:
        return input, jnp.ones(input.shape, jnp.bool_)
    dt = float_compute(input.dtype)
    keep = jax.random.uniform(rng_key(), input.shape, dt) < 1 - p
    # where() keeps p = 1 (scale inf) from turning 0 * inf into NaN
    scaled = input.astype(dt) * jnp.asarray(1 / (1 - p)).astype(dt)
    return jnp.where(keep, scaled, 0).astype(input.dtype), keep


@xla("aten::native_dropout_backward")
def native_dropout_backward(grad_output, mask, scale):
    dt = grad_output.dtype
    return grad_output * (mask.astype(dt) * jnp.asarray(scale).astype(dt))


@xla("aten::multinomial", random=True)
def multinomial(self, num_samples, replacement=False, *, generator=None):
    """Draws per row of (unnormalised) weights; without replacement by Gumbel top-k."""
    # torch's kernel (not its meta function) rejects these; the value checks are deferred
    if not jnp.issubdtype(self.dtype, jnp.floating):
        raise RuntimeError("multinomial: multinomial only supports floating-point dtypes for input")
    if self.ndim not in (1, 2):
        raise RuntimeError("multinomial: prob_dist must be 1 or 2 dim")
    if num_samples <= 0:
        raise RuntimeError("multinomial: cannot sample n_sample <= 0 samples")
    if not replacement and num_samples > self.shape[-1]:
        raise RuntimeError("multinomial: cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    check(jnp.isfinite(self) & (self >= 0),
          "probability tensor contains either `inf`, `nan` or element < 0", RuntimeError)
    check(jnp.sum(self.astype(float_compute(self.dtype)), axis=-1) > 0,
          "invalid multinomial distribution (sum of probabilities <= 0)", RuntimeError)
    dt = float_compute(self.dtype)
    logits = jnp.log(self.astype(dt))
    key = rng_key()
    if replacement:
        shape = (num_samples,) + logits.shape[:-1]
        draws = jax.random.categorical(key, logits, axis=-1, shape=shape)
        return jnp.moveaxis(draws, 0, -1).astype(jnp.int64)
    gumbel = jax.random.gumbel(key, logits.shape, dt)
    return jax.lax.top_k(logits + gumbel, num_samples)[1].astype(jnp.int64)
