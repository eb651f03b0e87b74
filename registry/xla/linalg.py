"""Linear-algebra lowerings: LU (factor, solve, unpack), solve, det, slogdet, inverse,
Cholesky, triangular solves, QR, geqrf, Householder products, SVD, eigh, eig, pinv,
matrix_exp, cross, _linalg_check_errors (lstsq: linalg_lstsq.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from tpu_kernels.registry.context import check
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import float_compute


# Factorizations follow torch's layouts: LU pivots are 1-based int32 (LAPACK's), info is an
# int32 per matrix (0 = success), outputs a mode does not compute are empty (shape (0,)).
# Decompositions with a sign/order freedom (QR, SVD, eigh, eig) may legitimately differ
# from LAPACK's choice; torch only promises the factorization properties.
_linalg = jax.lax.linalg
_EMPTY_SHAPE = (0,)


def _empty(dtype) -> jax.Array:
    return jnp.zeros(_EMPTY_SHAPE, dtype)


def _mT(x: jax.Array) -> jax.Array:
    return jnp.swapaxes(x, -1, -2)


def _mH(x: jax.Array) -> jax.Array:
    return jnp.conj(_mT(x)) if jnp.iscomplexobj(x) else _mT(x)


def _batch_broadcast(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Broadcast the batch dims (all but the last two) of two matrix stacks."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


def _lu(a: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(LU, 1-based int32 pivots, row permutation, LAPACK getrf info) of ``a``."""
    lu, piv, perm = _linalg.lu(a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    zero = diag == 0
    # info: 1-based index of the first zero pivot, 0 when U is nonsingular
    if zero.shape[-1] == 0:  # 0 x n or m x 0: nothing to pivot, info 0
        return lu, (piv + 1).astype(jnp.int32), perm, jnp.zeros(zero.shape[:-1], jnp.int32)
    info = jnp.where(jnp.any(zero, -1), jnp.argmax(zero, -1) + 1, 0).astype(jnp.int32)
    return lu, (piv + 1).astype(jnp.int32), perm, info


def _perm_from_pivots(pivots: jax.Array, m: int) -> jax.Array:
    return _linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, m)


def _lu_solve(lu: jax.Array, perm: jax.Array, b: jax.Array, adjoint: bool = False) -> jax.Array:
    """Solve A x = b (or A^H x = b) for A = P L U given as LU and its row permutation."""
    lu, b = _batch_broadcast(lu, b)
    perm = jnp.broadcast_to(perm, b.shape[:-2] + perm.shape[-1:])
    if not adjoint:
        x = jnp.take_along_axis(b, perm[..., None], axis=-2)
        x = _linalg.triangular_solve(lu, x, left_side=True, lower=True, unit_diagonal=True)
        return _linalg.triangular_solve(lu, x, left_side=True, lower=False)
    conj = jnp.iscomplexobj(lu)
    y = _linalg.triangular_solve(lu, b, left_side=True, lower=False, transpose_a=True, conjugate_a=conj)
    y = _linalg.triangular_solve(lu, y, left_side=True, lower=True, transpose_a=True,
                                 conjugate_a=conj, unit_diagonal=True)
    inv = jnp.argsort(perm, axis=-1)
    return jnp.take_along_axis(y, inv[..., None], axis=-2)


def _is_vector_rhs(a: jax.Array, b: jax.Array) -> bool:
    """torch.linalg.solve's rule for treating B as a (batch of) vector(s)."""
    return b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])


@xla("aten::_linalg_solve_ex.default")
def linalg_solve_ex(A, B, *, left=True, check_errors=False):
    # LU is A's own factorization also for left=False: torch's backward for a tensor subclass
    # solves with it as A's (linalg_lu_solve(LU, pivots, gX, left, adjoint=True))
    lu, piv, perm, info = _lu(A)
    if left:
        vec = _is_vector_rhs(A, B)
        x = _lu_solve(lu, perm, B[..., None] if vec else B)
        return (x[..., 0] if vec else x), lu, piv, info
    # X A = B  <=>  A^T X^T = B^T
    return _mT(_lu_solve_transposed(lu, perm, _mT(B))), lu, piv, info


@xla("aten::linalg_lu_factor_ex.default")
def linalg_lu_factor_ex(A, *, pivot=True, check_errors=False):
    lu, piv, _, info = _lu(A)
    return lu, piv, info


@xla("aten::linalg_lu_solve.default")
def linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False):
    perm = _perm_from_pivots(pivots, LU.shape[-2])
    if left:
        return _lu_solve(LU, perm, B, adjoint)
    # X A = B  <=>  A^T X^T = B^T (and X A^H = B <=> A X^H = B^H)
    if adjoint:
        return _mH(_lu_solve(LU, perm, _mH(B), False))
    return _mT(_lu_solve_transposed(LU, perm, _mT(B)))


def _lu_solve_transposed(lu, perm, b):
    """Solve A^T x = b (no conjugation) from A's LU."""
    return jnp.conj(_lu_solve(lu, perm, jnp.conj(b), adjoint=True)) if jnp.iscomplexobj(lu) \
        else _lu_solve(lu, perm, b, adjoint=True)


def _unpack(lu: jax.Array, perm: jax.Array | None, unpack_data=True, unpack_pivots=True):
    """(P, L, U) with A = P @ L @ U from an LU factorization and its row permutation."""
    m, n = lu.shape[-2:]
    k = min(m, n)
    if unpack_pivots:
        eye = jnp.eye(m, dtype=lu.dtype)
        p = _mT(eye[perm])            # P^T's row i is e_perm[i]
    else:
        p = _empty(lu.dtype)
    if not unpack_data:
        return p, _empty(lu.dtype), _empty(lu.dtype)
    low = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    up = jnp.triu(lu[..., :k, :])
    return p, low, up


@xla("aten::linalg_lu.default")
def linalg_lu(A, *, pivot=True):
    lu, _, perm, _ = _lu(A)
    return _unpack(lu, perm)


@xla("aten::lu_unpack.default")
def lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    perm = _perm_from_pivots(LU_pivots, LU_data.shape[-2]) if unpack_pivots else None
    return _unpack(LU_data, perm, unpack_data, unpack_pivots)


def _perm_sign(piv: jax.Array, dtype) -> jax.Array:
    """+-1: the parity of the row swaps recorded in 1-based pivots."""
    swaps = jnp.sum(piv != jnp.arange(1, piv.shape[-1] + 1, dtype=piv.dtype), axis=-1)
    return jnp.where(swaps % 2 == 0, 1, -1).astype(dtype)


# torch's det/slogdet return the LU of A^T (LAPACK sees the row-major A as A^T); the
# determinant is the same
@xla("aten::_linalg_det.default")
def linalg_det(A):
    lu, piv, _, _ = _lu(_mT(A))
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    return _perm_sign(piv, A.dtype) * jnp.prod(diag, axis=-1), lu, piv


@xla("aten::_linalg_slogdet.default")
def linalg_slogdet(A):
    lu, piv, _, _ = _lu(_mT(A))
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    absd = jnp.abs(diag)
    phase = jnp.prod(jnp.where(absd == 0, 0, diag / jnp.where(absd == 0, 1, absd)), axis=-1)
    sign = _perm_sign(piv, A.dtype) * phase
    return sign, jnp.sum(jnp.log(absd), axis=-1), lu, piv


@xla("aten::linalg_inv_ex.default")
def linalg_inv_ex(A, *, check_errors=False):
    lu, _, perm, info = _lu(A)
    eye = jnp.broadcast_to(jnp.eye(A.shape[-1], dtype=A.dtype), A.shape)
    return _lu_solve(lu, perm, eye), info


# -- Cholesky ---------------------------------------------------------------------------------------
def _cholesky(a: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Lower Cholesky factor (from the lower triangle) and LAPACK's info: the order of the
    first leading minor that is not positive-definite, 0 if none.

    XLA reports failure by NaNs in the whole factor, not the failing minor, so when any
    matrix failed the order is found by ``_first_bad_minor`` (a column loop: the
    successful call does not pay it)."""
    low = _linalg.cholesky(a, symmetrize_input=False)
    bad = jnp.any(jnp.isnan(low), axis=(-2, -1)) & ~jnp.any(jnp.isnan(a), axis=(-2, -1))
    batch = a.reshape(-1, *a.shape[-2:])
    info = jax.lax.cond(jnp.any(bad), lambda m: jax.vmap(_first_bad_minor)(m),
                        lambda m: jnp.zeros(m.shape[0], jnp.int32), batch)
    return low, jnp.where(bad, info.reshape(bad.shape), 0)


def _first_bad_minor(a: jax.Array) -> jax.Array:
    """The order of the first leading minor of Hermitian ``a`` (its lower triangle) that is
    not positive-definite, 0 if none: an unblocked Cholesky, column by column, that notes
    the first column whose pivot ``a[j, j] - |L[j, :j]|^2`` is not positive."""
    n = a.shape[-1]
    idx = jnp.arange(n)

    def column(j, carry):
        low, info = carry
        row = jnp.where(idx < j, low[j], 0)
        pivot = a[j, j].real - jnp.sum(jnp.abs(row) ** 2)
        ok = pivot > 0
        info = jnp.where((info == 0) & ~ok, j + 1, info)
        d = jnp.sqrt(jnp.where(ok, pivot, 1)).astype(a.dtype)
        col = jnp.where(idx > j, (a[:, j] - low @ row.conj()) / d, jnp.where(idx == j, d, 0))
        return low.at[:, j].set(col), info
    return jax.lax.fori_loop(0, n, column, (jnp.zeros_like(a), jnp.int32(0)))[1]


def _lower_input(a: jax.Array, upper: bool) -> jax.Array:
    """The Hermitian matrix read from the triangle torch reads, as a lower triangle."""
    return _mH(a) if upper else a


@xla("aten::linalg_cholesky_ex.default")
def linalg_cholesky_ex(self, *, upper=False, check_errors=False):
    low, info = _cholesky(_lower_input(self, upper))
    return (_mH(low) if upper else low), info


@xla("aten::cholesky.default")
def cholesky(self, upper=False):
    low, _ = _cholesky(_lower_input(self, upper))
    return _mH(low) if upper else low


def _chol_solve(low: jax.Array, b: jax.Array) -> jax.Array:
    """Solve (L L^H) x = b."""
    low, b = _batch_broadcast(low, b)
    y = _linalg.triangular_solve(low, b, left_side=True, lower=True)
    return _linalg.triangular_solve(low, y, left_side=True, lower=True, transpose_a=True,
                                    conjugate_a=jnp.iscomplexobj(low))


@xla("aten::cholesky_solve.default")
def cholesky_solve(self, input2, upper=False):
    return _chol_solve(_mH(input2) if upper else input2, self)


@xla("aten::cholesky_inverse.default")
def cholesky_inverse(self, upper=False):
    eye = jnp.broadcast_to(jnp.eye(self.shape[-1], dtype=self.dtype), self.shape)
    return _chol_solve(_mH(self) if upper else self, eye)


# -- triangular solves ---------------------------------------------------------------------------------
@xla("aten::linalg_solve_triangular.default")
def linalg_solve_triangular(self, B, *, upper, left=True, unitriangular=False):
    a, b = _batch_broadcast(self, B)
    return _linalg.triangular_solve(a, b, left_side=left, lower=not upper,
                                    unit_diagonal=unitriangular)


@xla("aten::triangular_solve.default")
def triangular_solve(self, A, upper=True, transpose=False, unitriangular=False):
    a, b = _batch_broadcast(A, self)
    x = _linalg.triangular_solve(a, b, left_side=True, lower=not upper, transpose_a=transpose,
                                 unit_diagonal=unitriangular)
    return x, a


# -- orthogonal factorizations and spectra ------------------------------------------------------------------
@xla("aten::linalg_qr.default")
def linalg_qr(A, mode="reduced"):
    if mode == "r":
        return _empty(A.dtype), jnp.linalg.qr(A, mode="r")
    return tuple(jnp.linalg.qr(A, mode=mode))


def _geqrf(a):
    fn = getattr(_linalg, "geqrf", None)
    if fn is None:  # not re-exported by jax.lax.linalg in this jax version
        from jax._src.lax.linalg import geqrf as fn
    return fn(a)


@xla("aten::geqrf.default", data_dependent=True)  # torch has no meta for geqrf: run eagerly
def geqrf(self):
    return tuple(_geqrf(self))


@xla("aten::linalg_householder_product.default")
def linalg_householder_product(input, tau):
    return _linalg.householder_product(input, tau)


@xla("aten::ormqr.default")
def ormqr(self, input2, input3, left=True, transpose=False):
    return _linalg.ormqr(self, input2, input3, left=left, transpose=transpose)


@xla("aten::_linalg_svd.default")
def linalg_svd(A, full_matrices=False, compute_uv=True, *, driver=None):
    if not compute_uv:
        return _empty(A.dtype), jnp.linalg.svd(A, compute_uv=False), _empty(A.dtype)
    u, s, vh = jnp.linalg.svd(A, full_matrices=full_matrices)
    return u, s, vh


@xla("aten::_linalg_eigh.default")
def linalg_eigh(A, UPLO="L", compute_v=True):
    a = A if UPLO == "L" else _mH(A)  # eigh reads the lower triangle
    vecs, vals = _linalg.eigh(a, lower=True, symmetrize_input=False)
    return vals, (vecs if compute_v else _empty(A.dtype))


def _eig_supported(*args, **kwargs):
    return jax.default_backend() == "cpu" or "XLA has no eig on this backend (jax lowers it for the CPU only)"


@xla("aten::linalg_eig.default", supports=_eig_supported)
def linalg_eig(self):
    vals, vecs = _linalg.eig(self, compute_left_eigenvectors=False)
    return vals, vecs


# -- derived ops ---------------------------------------------------------------------------------------------
def _pinv(a, atol, rtol, hermitian: bool):
    m, n = a.shape[-2:]
    real = jnp.finfo(a.dtype).dtype
    if hermitian:
        v, w = _linalg.eigh(a, lower=True, symmetrize_input=False)
        s = jnp.abs(w)
    else:
        u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    smax = jnp.max(s, axis=-1, keepdims=True) if s.shape[-1] else jnp.zeros(s.shape[:-1] + (1,), real)
    atol_ = jnp.zeros((), real) if atol is None else jnp.asarray(atol, real)
    if rtol is None:  # torch: eps * max(m, n), or 0 when only atol is given and positive
        eps_rtol = jnp.asarray(jnp.finfo(real).eps * max(m, n), real)
        rtol_ = eps_rtol if atol is None else jnp.where(atol_ > 0, 0, eps_rtol)
    else:
        rtol_ = jnp.asarray(rtol, real)
    thr = jnp.maximum(atol_[..., None] if jnp.ndim(atol_) else atol_,
                      (rtol_[..., None] if jnp.ndim(rtol_) else rtol_) * smax)
    keep = s > thr
    sinv = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(a.dtype)
    if hermitian:
        winv = jnp.where(keep, 1 / jnp.where(keep, w, 1), 0).astype(a.dtype)
        return (v * winv[..., None, :]) @ _mH(v)
    return (_mH(vh) * sinv[..., None, :]) @ _mH(u)


@xla("aten::linalg_pinv.atol_rtol_tensor", "aten::linalg_pinv.atol_rtol_float")
def linalg_pinv(self, *, atol=None, rtol=None, hermitian=False):
    return _pinv(self, atol, rtol, hermitian)


@xla("aten::linalg_matrix_exp.default")
def linalg_matrix_exp(self):
    import jax.scipy.linalg as jsl
    fn = jsl.expm
    for _ in range(self.ndim - 2):
        fn = jax.vmap(fn)
    return fn(self.astype(float_compute(self.dtype))).astype(self.dtype)  # half types in float32


@xla("aten::linalg_cross.default")
def linalg_cross(self, other, *, dim=-1):
    a, b = jnp.broadcast_arrays(self, other)
    return jnp.cross(a, b, axis=dim)


@xla("aten::_linalg_check_errors.default")
def linalg_check_errors(info, api_name, *, is_matrix):
    """Inside compiled and deferred programs: a device-side check raised at the next
    synchronisation (eager tpu reads ``info`` at once, as torch's CUDA does:
    ``runtime_ops/linalg_checks.py``)."""
    exc, message = linalg_error(api_name, None, None)
    check(info == 0, message, exc)
    return None


def linalg_error(api_name: str, code: int | None, batch: int | None) -> tuple[type, str]:
    """The exception torch raises for a failed linalg call: its type and message, for
    error ``code`` (an ``info`` value; None: unknown, the check is on the device) of
    batch element ``batch`` (None: a single matrix)."""
    n = "?" if code is None else code
    where = "" if batch is None else f"(Batch element {batch}): "
    exc = torch.linalg.LinAlgError
    if code is not None and code < 0:
        text = f"Argument {-code} has illegal value. Most certainly there is a bug in the implementation calling the backend library."
    elif "inv" in api_name:
        text = f"The diagonal element {n} is zero, the inversion could not be completed because the input matrix is singular."
    elif "solve" in api_name:
        text = "The solver failed because the input matrix is singular."
    elif "cholesky" in api_name:
        text = ("The factorization could not be completed because the input is not positive-definite "
                f"(the leading minor of order {n} is not positive-definite).")
    elif "svd" in api_name:
        text = ("The algorithm failed to converge because the input matrix is ill-conditioned or has "
                f"too many repeated singular values (error code: {n}).")
    elif "eig" in api_name or "syevd" in api_name:
        text = ("The algorithm failed to converge because the input matrix is ill-conditioned or has "
                f"too many repeated eigenvalues (error code: {n}).")
    elif "lstsq" in api_name:
        text = ("The least squares solution could not be computed because the input matrix does not "
                f"have full rank (error code: {n}).")
    elif "lu_factor" in api_name:
        exc = RuntimeError
        text = (f"U[{n},{n}] is zero and using it on lu_solve would result in a division by zero. If you "
                "still want to perform the factorization, consider calling linalg.lu(A, pivot) or "
                "linalg.lu_factor_ex(A, pivot)")
    else:
        exc, text = RuntimeError, f"Unknown error code {n}."
    if code is None:
        text += " (checked on the device, raised at the next synchronisation)"
    return exc, f"{api_name}: {where}{text}"
