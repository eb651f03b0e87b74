"""Gamma-family lowerings: ``_standard_gamma`` (Gamma(alpha, 1) draws) and
``_sample_dirichlet``, and the reparameterization gradients autograd asks for with them,
``_standard_gamma_grad`` (d sample / d alpha) and ``_dirichlet_grad``. torch.distributions'
Gamma, Chi2, StudentT, Beta and Dirichlet sample through these.

Draws come from ``rng_key()`` (jax's Marsaglia-Tsang sampler), not CPU torch's stream.
The gradients are torch's own approximations of -(d cdf / d alpha) / pdf (Taylor series,
Rice saddle-point expansions and rational fits, ``aten/src/ATen/native/Distributions.h``),
evaluated with CPU's precisions: double where CPU accumulates in double, the tensor's type
where CPU's helpers do, so the values are CPU's. Like CPU torch, all four take float32 and
float64 only (half types raise NotImplementedError, as CPU does).

On a TPU (v5e, measured): float64 is emulated, so each float64 log or exp adds seconds of
compile time; the gradients compile in about 25 s (gamma) and 30 s (Dirichlet) per shape,
and their float64 parts still give CPU's float32 values. The float32 parts of
``_dirichlet_grad`` (CPU computes them in float too) use the TPU's float32 log, less exact
than CPU's: there they agree with CPU to about 1e-3, inside the approximations' own error.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tpu_kernels.registry.context import out_dtype, rng_key
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.dtypes import kernel_error
from tpu_kernels.registry.xla._util import meta_like

Array = jax.Array
F64 = jnp.float64

# torch ships no Meta kernel for these; each result is shaped like its first argument
meta_like("_standard_gamma_grad", "self")
meta_like("_sample_dirichlet", "self")
meta_like("_dirichlet_grad", "x")


def _floats_only(x: Array, kernel: str) -> None:
    """CPU torch's kernels dispatch on float32 and float64 only: the same error here."""
    if np.dtype(x.dtype) not in (np.float32, np.float64):
        raise kernel_error(kernel, x.dtype)


def _f32(v: float) -> float:
    """A C float literal (0.8f) as the double it widens to when compared with a double."""
    return float(np.float32(v))


_PSI_10 = 2.25175258906672110764
_DIGAMMA_A = (8.33333333333333333333e-2, -2.10927960927960927961e-2, 7.57575757575757575758e-3,
              -4.16666666666666666667e-3, 3.96825396825396825397e-3, -8.33333333333333333333e-3,
              8.33333333333333333333e-2)


def _digamma(x: Array) -> Array:
    """torch's ``digamma_one<scalar_t, double>`` with scalar_t = ``x.dtype``, for x >= 0
    (concentrations; negative x gives NaN, not torch's reflection): x steps up to 10 in its
    own type while the sum of -1/x is kept in double, then the asymptotic series; +inf at 0.
    Its one log is in x's type: float32 callers pay no float64 log (slow to compile on TPU)."""
    x0, dt = x, x.dtype
    result = jnp.zeros(x.shape, F64)
    for _ in range(10):   # any x > 0 reaches 10 within 10 steps
        low = x < 10
        result = result - jnp.where(low, 1 / x, 0).astype(F64)
        x = jnp.where(low, x + 1, x)
    z = 1.0 / (x * x).astype(F64)
    poly = jnp.zeros_like(z)
    for c in _DIGAMMA_A:
        poly = poly * z + c
    y = jnp.where(x < _f32(1e17), z * poly, 0)
    series = result + jnp.log(x).astype(F64) - (0.5 / x).astype(F64) - y
    out = jnp.where(x == 10, result + _PSI_10, series)
    out = jnp.where(x0 == 0, jnp.inf, jnp.where(x0 < 0, jnp.nan, out))
    return out.astype(dt)


def _pow_1_5(b: Array) -> Array:
    """b ** 1.5 for b >= 0 (NaN below, as pow): a square root, not a float64 pow (a log
    and an exp, each several seconds to compile on TPU)."""
    return b * jnp.sqrt(b)


def _nan_to_zero(x: Array) -> Array:
    return jnp.where(jnp.isnan(x), jnp.zeros((), x.dtype), x)


# -- sampling --------------------------------------------------------------------------------
@xla("aten::_standard_gamma", random=True)
def standard_gamma(self: Array, generator=None) -> Array:
    _floats_only(self, "gamma_cpu")
    g = jax.random.gamma(rng_key(), self, self.shape, self.dtype)
    # CPU clamps to the smallest normal number: 0 (alpha = 0, underflow) and NaN map to it
    tiny = jnp.asarray(jnp.finfo(self.dtype).tiny, self.dtype)
    return jnp.where(g > tiny, g, tiny)


@xla("aten::_sample_dirichlet", random=True)
def sample_dirichlet(self: Array, generator=None) -> Array:
    """Gammas normalized along the last dim. CPU draws the gammas in double so tiny alphas
    do not underflow to 0/0; drawing log-gammas and normalizing with a softmax does the
    same in the tensor's own type."""
    _floats_only(self, "dirichlet")
    dt = self.dtype
    alpha = self.reshape(self.shape or (1,))
    lg = jax.random.loggamma(rng_key(), alpha, alpha.shape, dt)
    # CPU clamps each gamma (and a NaN one) to the smallest normal double
    floor = jnp.asarray(np.log(np.finfo(np.float64).tiny), dt)
    lg = jnp.where(lg > floor, lg, floor)
    x = jax.nn.softmax(lg, axis=-1).reshape(self.shape)
    # then the ratios (NaN ones included) to [smallest normal, largest float below 1]
    lo = jnp.asarray(jnp.finfo(dt).tiny, dt)
    hi = jnp.asarray(np.nextafter(np.ones((), dt), 0), dt)
    x = jnp.where(x > lo, x, lo)
    return jnp.where(x < hi, x, hi)


# -- d(gamma sample) / d(alpha) ------------------------------------------------------------------
def _gamma_grad_small_x(alpha: Array, x: Array) -> Array:
    """x < 0.8: Taylor series of the regularized incomplete gamma function in x."""
    numer = jnp.ones_like(x)
    denom = alpha
    series1 = numer / denom
    series2 = numer / (denom * denom)
    for i in range(1, 6):
        numer = numer * (-x / i)
        denom = denom + 1
        series1 = series1 + numer / denom
        series2 = series2 + numer / (denom * denom)
    log_x = jnp.log(x)   # the powers share it: x ** alpha = exp(alpha log x)
    pow_x_alpha = jnp.exp(alpha * log_x)
    pdf = jnp.exp((alpha - 1) * log_x - x)   # x ** (alpha - 1) * exp(-x)
    cdf = pow_x_alpha * series1
    cdf_alpha = (log_x - _digamma(alpha)) * cdf - pow_x_alpha * series2
    return _nan_to_zero(-cdf_alpha / pdf)


def _gamma_grad_large_alpha(alpha: Array, x: Array) -> Array:
    """alpha > 8: Rice saddle-point expansion (a polynomial near the mode)."""
    a = alpha
    numer_1 = 1 + 24 * a * (1 + 12 * a)
    numer_2 = 1440 * (a * a) + 6 * x * (53 - 120 * x) - 65 * x * x / a + a * (107 + 3600 * x)
    near_mode = numer_1 * numer_2 / (1244160 * (a * a) * (a * a))
    denom = jnp.sqrt(8 * a)
    term2 = denom / (a - x)
    term3 = 1 / _pow_1_5(x - a - a * jnp.log(x / a))
    term23 = jnp.where(x < a, term2 - term3, term2 + term3)
    term1 = jnp.log(x / a) * term23 - jnp.sqrt(2 / a) * (a + x) / ((a - x) * (a - x))
    stirling = 1 + 1 / (12 * a) * (1 + 1 / (24 * a))
    far = -stirling * (x * term1) / denom
    return jnp.where((_f32(0.9) * a <= x) & (x <= _f32(1.1) * a), near_mode, far)


# torch's bivariate rational fit in (u, v) = (log(x / alpha), log(alpha)): rows are the
# coefficients of 1, u, u^2; columns 0-3 the numerator's and 4-7 the denominator's cubic in v
_GAMMA_UV = np.array([
    [0.16009398, -0.094634809, 0.025146376, -0.0030648343, 1, 0.32668115, 0.10406089, 0.0014179084],
    [0.53487893, 0.1298071, 0.065735949, -0.0015649758,
     0.16639465, 0.020070113, -0.0035938915, -0.00058392623],
    [0.040121004, -0.0065914022, -0.0026286047, -0.0013441777,
     0.017050642, -0.0021309326, 0.00085092367, -1.5247877e-07]])


def _cubic(c: list[Array], v: Array) -> Array:
    return c[0] + v * (c[1] + v * (c[2] + v * c[3]))


def _gamma_grad_rational(alpha: Array, x: Array) -> Array:
    """x >= 0.8, alpha <= 8: the rational fit."""
    u, v = jnp.log(x / alpha), jnp.log(alpha)
    c = [_GAMMA_UV[0, i] + u * (_GAMMA_UV[1, i] + u * _GAMMA_UV[2, i]) for i in range(8)]
    return jnp.exp(_cubic(c[:4], v) / _cubic(c[4:], v))


@xla("aten::_standard_gamma_grad")
def standard_gamma_grad(self: Array, output: Array) -> Array:
    """-(d cdf / d alpha) / pdf at x = ``output`` ~ Gamma(alpha = ``self``), in double as
    CPU computes it."""
    _floats_only(self, "_standard_gamma_grad_cpu")
    alpha, x = jnp.broadcast_arrays(self.astype(F64), output.astype(F64))
    grad = jnp.where(x < _f32(0.8), _gamma_grad_small_x(alpha, x),
                     jnp.where(alpha > 8, _gamma_grad_large_alpha(alpha, x),
                               _gamma_grad_rational(alpha, x)))
    return grad.astype(out_dtype())


# -- Dirichlet: Beta(alpha, total - alpha) gradients -------------------------------------------
def _beta_grad_alpha_small(x: Array, alpha: Array, beta: Array) -> Array:
    """x near 0: Taylor expansion (computed in the tensor's type, as CPU does)."""
    factor = _digamma(alpha) - _digamma(alpha + beta) - jnp.log(x)
    numer = jnp.ones_like(x)
    series = numer / alpha * (factor + 1 / alpha)
    for i in range(1, 11):
        numer = numer * ((i - beta) * x / i)
        denom = alpha + i
        series = series + numer / denom * (factor + 1 / denom)
    return _nan_to_zero(x * (1 - x) ** -beta * series)


def _beta_grad_beta_small(x: Array, alpha: Array, beta: Array) -> Array:
    """d/d beta of Beta(alpha, beta) for x near 0: Taylor expansion (the tensor's type)."""
    factor = _digamma(alpha + beta) - _digamma(beta)
    numer, betas, dbetas = jnp.ones_like(x), jnp.ones_like(x), jnp.zeros_like(x)
    series = factor / alpha
    for i in range(1, 9):
        numer = numer * (-x / i)
        dbetas = dbetas * (beta - i) + betas
        betas = betas * (beta - i)
        series = series + numer / (alpha + i) * (dbetas + factor * betas)
    return _nan_to_zero(-((1 - x) ** (1 - beta)) * series)


def _beta_grad_alpha_mid(x: Array, alpha: Array, beta: Array) -> Array:
    """alpha, beta > 6: Rice saddle-point expansion, in double (a polynomial near the mean)."""
    a, b = alpha, beta
    total = a + b
    mean = a / total
    std = jnp.sqrt(a * b / (total + 1)) / total
    poly = 47 * x * (b * b) * (b * b) + a * (
        (43 + 20 * (16 + 27 * b) * x) * (b * b) * b + a * (
            3 * (59 + 180 * b - 90 * x) * (b * b) + a * (
                (453 + 1620 * b * (1 - x) - 455 * x) * b + a * (8 * (1 - x) * (135 * b - 11)))))
    pre_num = (1 + 12 * a) * (1 + 12 * b) / (total * total)
    pre_den = 12960 * a * a * a * b * b * (1 + 12 * total)
    near_mean = pre_num / (1 - x) * poly / pre_den

    prefactor = -x / jnp.sqrt(2 * a * b / total)
    stirling = ((1 + 1 / (12 * a) + 1 / (288 * a * a)) * (1 + 1 / (12 * b) + 1 / (288 * b * b))
                / (1 + 1 / (12 * total) + 1 / (288 * total * total)))
    term1_num = 2 * (a * a) * (x - 1) + a * b * (x - 1) - x * (b * b)
    axbx = a * (x - 1) + b * x
    term1 = term1_num / (jnp.sqrt(2 * a / b) * _pow_1_5(total) * axbx * axbx)
    term2 = 0.5 * jnp.log(a / (total * x))
    term3 = jnp.sqrt(8 * a * b / total) / (b * x + a * (x - 1))
    term4 = 1 / _pow_1_5(b * jnp.log(b / (total * (1 - x))) + a * jnp.log(a / (total * x)))
    far = stirling * prefactor * (term1 + term2 * (term3 + jnp.where(x < mean, term4, -term4)))
    return jnp.where((mean - 0.1 * std <= x) & (x <= mean + 0.1 * std), near_mean, far)


# torch's rational correction: _DIRICHLET_C[k, i, j] holds the cubic in b of the
# numerator's (k = 0) or denominator's (k = 1) coefficient of u^i a^j
_DIRICHLET_C = np.array([
    [[[1.003668233, -0.01061107488, -0.0657888334, 0.01201642863],
      [0.6336835991, -0.3557432599, 0.05486251648, -0.001465281033],
      [-0.03276231906, 0.004474107445, 0.002429354597, -0.0001557569013]],
     [[0.221950385, -0.3187676331, 0.01799915743, 0.01074823814],
      [-0.2951249643, 0.06219954479, 0.01535556598, 0.001550077057],
      [0.02155310298, 0.004170831599, 0.001292462449, 6.976601077e-05]],
     [[-0.05980841433, 0.008441916499, 0.01085618172, 0.002319392565],
      [0.02911413504, 0.01400243777, -0.002721828457, 0.000751041181],
      [0.005900514878, -0.001936558688, -9.495446725e-06, 5.385558597e-05]]],
    [[[1, -0.02924021934, -0.04438342661, 0.007285809825],
      [0.6357567472, -0.3473456711, 0.05454656494, -0.002407477521],
      [-0.03301322327, 0.004845219414, 0.00231480583, -0.0002307248149]],
     [[0.5925320577, -0.1757678135, 0.01505928619, 0.000564515273],
      [0.1014815858, -0.06589186703, 0.01272886114, -0.0007316646956],
      [-0.007258481865, 0.001096195486, 0.0003934994223, -4.12701925e-05]],
     [[0.06469649321, -0.0236701437, 0.002902096474, -5.896963079e-05],
      [0.001925008108, -0.002869809258, 0.0008000589141, -6.063713228e-05],
      [-0.0003477407336, 6.959756487e-05, 1.097287507e-05, -1.650964693e-06]]]])


def _beta_grad_rational(x: Array, alpha: Array, total: Array, dt) -> Array:
    """Elsewhere: a rational correction to an analytic approximation, in double (its
    digammas take and return the tensor's type ``dt``, as CPU's do)."""
    u = jnp.log(x)
    a = jnp.log(alpha) - u
    b = jnp.log(total) - a
    p = q = jnp.zeros_like(x)
    for i in range(3):
        for j in range(3):
            ua = u ** i * a ** j if i or j else 1.0
            p = p + ua * _cubic(list(_DIRICHLET_C[0, i, j]), b)
            q = q + ua * _cubic(list(_DIRICHLET_C[1, i, j]), b)
    digammas = _digamma(total.astype(dt)).astype(F64) - _digamma(alpha.astype(dt)).astype(F64)
    return p / q * (x * digammas / (total - alpha))


@xla("aten::_dirichlet_grad")
def dirichlet_grad(x: Array, alpha: Array, total: Array) -> Array:
    """d x / d alpha for x ~ Beta(alpha, total - alpha), scaled by 1 / (1 - x): what
    Dirichlet.rsample's backward combines into the Dirichlet gradient. The branch is
    chosen in the tensor's type, as CPU chooses it."""
    _floats_only(x, "_dirichlet_grad_cpu")
    dt = x.dtype
    x, alpha, total = jnp.broadcast_arrays(x, alpha.astype(dt), total.astype(dt))
    beta = total - alpha
    boundary = total * x * (1 - x)
    x64, alpha64, total64 = x.astype(F64), alpha.astype(F64), total.astype(F64)
    grad = jnp.where(
        (x <= 0.5) & (boundary < 2.5), _beta_grad_alpha_small(x, alpha, beta).astype(F64),
        jnp.where((x >= 0.5) & (boundary < 0.75), -_beta_grad_beta_small(1 - x, beta, alpha).astype(F64),
                  jnp.where((alpha > 6) & (beta > 6), _beta_grad_alpha_mid(x64, alpha64, total64 - alpha64),
                            _beta_grad_rational(x64, alpha64, total64, dt))))
    return grad.astype(out_dtype())
