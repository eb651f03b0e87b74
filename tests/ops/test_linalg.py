"""Parity of the matmul-family and linear-algebra lowerings (registry/xla/matmul.py, linalg.py)."""
from __future__ import annotations

import pytest
import torch
from helpers import check, to_tpu

aten = torch.ops.aten
NAN = float("nan")


def _rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype) if not dtype.is_complex \
            else torch.randn(*shape, generator=g, dtype=dtype)
    return torch.randint(-9, 10, shape, generator=g).to(dtype)


# float32 at "highest" precision matches CPU within the f32 tolerance for these small k
MM_DTYPES = [torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.int32]


# -- matmul family ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", MM_DTYPES)
def test_mm_bmm_mv_dot(dtype):
    a, b = _rand(5, 7, dtype=dtype), _rand(7, 3, dtype=dtype, seed=1)
    check(torch.mm, a, b)
    check(torch.mm, b.t(), a.t())                              # non-contiguous
    check(torch.bmm, _rand(2, 3, 4, dtype=dtype), _rand(2, 4, 5, dtype=dtype, seed=1))
    check(torch.mv, a, _rand(7, dtype=dtype, seed=2))
    check(torch.dot, _rand(9, dtype=dtype), _rand(9, dtype=dtype, seed=1))


def test_mm_edge_cases():
    check(torch.mm, torch.zeros(3, 0), torch.zeros(0, 4))     # empty contraction -> zeros
    check(torch.mm, torch.zeros(0, 2), torch.zeros(2, 4))
    check(torch.bmm, torch.zeros(0, 2, 3), torch.zeros(0, 3, 4))
    check(torch.mm, torch.tensor([[NAN, 1.0]]), torch.ones(2, 2))
    check(torch.mm, _rand(3, 4, dtype=torch.complex64), _rand(4, 2, dtype=torch.complex64, seed=1))


def test_mm_int_wraps_like_torch():
    big = torch.full((2, 2), 2 ** 30, dtype=torch.int32)
    check(torch.mm, big, big)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_addmm_family(dtype):
    b = _rand(4, dtype=dtype, seed=3)
    m1, m2 = _rand(3, 5, dtype=dtype), _rand(5, 4, dtype=dtype, seed=1)
    check(torch.addmm, b, m1, m2)
    check(lambda s, x, y: torch.addmm(s, x, y, beta=2, alpha=3), _rand(3, 4, dtype=dtype), m1, m2)
    b1, b2 = _rand(2, 3, 5, dtype=dtype), _rand(2, 5, 4, dtype=dtype, seed=1)
    check(torch.baddbmm, _rand(2, 3, 4, dtype=dtype, seed=4), b1, b2)
    check(lambda s, x, y: torch.baddbmm(s, x, y, beta=0, alpha=2), b, b1, b2)
    # torch's CPU addbmm rounds to the result dtype after each batch's addmm; this lowering
    # rounds once, so bf16 compares on integer-valued data (exact either way)
    ib1, ib2 = (b1.round(), b2.round()) if dtype == torch.bfloat16 else (b1, b2)
    check(torch.addbmm, _rand(3, 4, dtype=dtype, seed=5).round(), ib1, ib2)
    check(lambda s, x, y: torch.addmv(s, x, y, alpha=2), _rand(3, dtype=dtype), m1, _rand(5, dtype=dtype))
    check(lambda s, x, y: torch.addr(s, x, y, beta=3), _rand(3, 4, dtype=dtype), _rand(3, dtype=dtype),
          _rand(4, dtype=dtype, seed=1))


def test_addmm_beta_zero_ignores_nan():
    s = torch.full((2, 2), NAN)
    check(lambda s, x, y: torch.addmm(s, x, y, beta=0), s, _rand(2, 3), _rand(3, 2))
    check(lambda s, x, y: torch.addr(s, x, y, beta=False), torch.tensor([[True, False]]),
          torch.tensor([True]), torch.tensor([False, True]))


def test_vdot_trilinear():
    check(torch.vdot, _rand(5), _rand(5, seed=1))
    check(torch.vdot, _rand(5, dtype=torch.complex64), _rand(5, dtype=torch.complex64, seed=1))
    i1, i2, i3 = _rand(2, 3), _rand(2, 4, seed=1), _rand(2, 5, seed=2)
    check(lambda a, b, c: aten._trilinear(a, b, c, [2, 3], [1, 3], [1, 2], []), i1, i2, i3)
    check(lambda a, b, c: aten._trilinear(a, b, c, [], [], [], [1]), i1, _rand(2, 3, seed=1), _rand(2, 3, seed=2))
    w = _rand(6, 3, 4)
    check(lambda x1, x2, w: torch.nn.functional.bilinear(x1, x2, w), i1, _rand(2, 4, seed=3), w)


def test_matmul_grads():
    a, b = _rand(3, 5).requires_grad_(), _rand(5, 4, seed=1).requires_grad_()
    check(torch.mm, a, b, grad=True)
    check(torch.addmm, _rand(4, seed=2).requires_grad_(), a, b, grad=True)
    x, y = _rand(2, 3, 5).requires_grad_(), _rand(2, 5, 4, seed=1).requires_grad_()
    check(torch.bmm, x, y, grad=True)
    check(torch.baddbmm, _rand(2, 3, 4, seed=3).requires_grad_(), x, y, grad=True)
    check(torch.matmul, _rand(4, 3, 5).requires_grad_(), b, grad=True)


def test_float32_matmul_precision_is_keyed():
    """Each precision setting lowers with its jax precision (the dispatch cache keys on it)."""
    import jax
    import jax.numpy as jnp
    from tpu_kernels.registry.xla import matmul
    a, b = _rand(8, 16), _rand(16, 8, seed=1)
    old = torch.get_float32_matmul_precision()
    want = {"highest": jax.lax.Precision.HIGHEST, "high": jax.lax.Precision.HIGH,
            "medium": jax.lax.Precision.DEFAULT}
    try:
        for p, prec in want.items():
            torch.set_float32_matmul_precision(p)
            assert matmul._precision(jnp.dtype(jnp.float32)) == prec
            assert matmul._precision(jnp.dtype(jnp.float64)) == jax.lax.Precision.HIGHEST
            if p == "highest":
                check(torch.mm, a, b)
            else:  # runs (a fresh trace per setting); on TPU these use bf16 passes
                torch.mm(*to_tpu((a, b))).cpu()
    finally:
        torch.set_float32_matmul_precision(old)


# -- linear algebra ------------------------------------------------------------------------------
LA_DTYPES = [torch.float32, torch.float64]


def _spd(*batch, n=4, dtype=torch.float64, seed=0):
    a = _rand(*batch, n, n, dtype=dtype, seed=seed)
    return (a @ a.mT.conj() + n * torch.eye(n, dtype=dtype)).to(dtype)


def _well_conditioned(*batch, n=4, dtype=torch.float32, seed=0):
    return (_rand(*batch, n, n, dtype=torch.float64, seed=seed) + 3 * torch.eye(n, dtype=torch.float64)).to(dtype)


def _tpu_call(fn, *args):
    return fn(*to_tpu(args))


@pytest.mark.parametrize("dtype", LA_DTYPES)
def test_solve_inv_det(dtype):
    a, b = _well_conditioned(2, dtype=dtype), _rand(2, 4, 3, dtype=dtype, seed=1)
    check(torch.linalg.solve, a, b)
    check(torch.linalg.solve, a, _rand(2, 4, dtype=dtype, seed=2))          # batched vectors
    check(lambda x, y: torch.linalg.solve(x, y, left=False), a, _rand(3, 4, dtype=dtype))
    check(lambda x, y: aten._linalg_solve_ex(x, y), a, b)
    check(torch.linalg.inv, a)
    check(torch.linalg.inv_ex, a[0])
    check(torch.linalg.det, a)
    check(torch.linalg.slogdet, a)
    check(aten._linalg_det, a)
    neg = a.clone()
    neg[0, 0] *= -1
    check(torch.linalg.slogdet, neg)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64])
def test_solve_right_side_grad(dtype):
    """linalg.solve(A, B, left=False) backward: torch's backward solves with the forward's LU
    as A's own factorization; the lowering returned A^T's (both gradients were wrong)."""
    a = _well_conditioned(2, dtype=dtype).requires_grad_()
    b = _rand(2, 3, 4, dtype=dtype, seed=1).requires_grad_()
    check(lambda x, y: torch.linalg.solve(x, y, left=False), a, b, grad=True)


@pytest.mark.parametrize("shapes", [((2, 5, 3), (2, 5), "gelsd"), ((5, 3), (5,), "gelss"), ((2, 5, 3), (2, 5), None)])
def test_lstsq_batch_of_vectors(shapes):
    """An `other` of shape input.shape[:-1] is a batch of vectors (the lowering crashed in dot_general)."""
    a_shape, b_shape, driver = shapes
    check(lambda a, b: tuple(torch.linalg.lstsq(a, b, driver=driver)), _rand(*a_shape), _rand(*b_shape, seed=1))


@pytest.mark.parametrize("call", [
    lambda a, b: torch.linalg.lstsq(a, b[..., :2], driver="foo"),
    lambda a, b: torch.linalg.lstsq(a[0, :, 0], b[0, :, 0]),
    lambda a, b: torch.linalg.lstsq(a[0], b),
    lambda a, b: torch.linalg.lstsq(a, b[..., :4, :]),
    lambda a, b: torch.linalg.lstsq(a, b[:, :4, 0]),
    lambda a, b: torch.linalg.lstsq(a, b.double()),
])
def test_lstsq_bad_arguments_raise_cpus_error(call):
    """torch has no meta function for lstsq: the lowering made none of CPU's checks (a bad
    driver was ignored, mismatched sizes crashed inside jax)."""
    a, b = _rand(2, 5, 3), _rand(2, 5, 2, seed=1)
    with pytest.raises(RuntimeError) as cpu:
        call(a, b)
    with pytest.raises(RuntimeError) as tpu:
        call(*to_tpu((a, b)))
    assert str(tpu.value) == str(cpu.value)


def test_singular_matrix_info():
    s = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    check(lambda x: torch.linalg.inv_ex(x).info, s)
    check(lambda x: torch.linalg.lu_factor_ex(x), s)
    check(torch.linalg.det, s)
    check(lambda x: torch.linalg.slogdet(x), torch.zeros(3, 3))


@pytest.mark.parametrize("dtype", LA_DTYPES + [torch.complex64])
def test_lu_family(dtype):
    a = _rand(2, 4, 4, dtype=dtype)
    check(torch.linalg.lu_factor, a)
    check(torch.linalg.lu, a)
    check(torch.linalg.lu, _rand(3, 5, dtype=dtype))          # wide
    check(torch.linalg.lu, _rand(5, 3, dtype=dtype))          # tall
    check(lambda x: torch.lu_unpack(*torch.linalg.lu_factor(x)), a)
    check(lambda x: torch.lu_unpack(*torch.linalg.lu_factor(x), unpack_pivots=False), a)
    b = _rand(2, 4, 3, dtype=dtype, seed=1)
    for left in (True, False):
        for adjoint in (False, True):
            rhs = b if left else b.mT
            check(lambda x, y: torch.linalg.lu_solve(*torch.linalg.lu_factor(x), y, left=left,
                                                     adjoint=adjoint), a, rhs)


@pytest.mark.parametrize("dtype", LA_DTYPES)
def test_cholesky_family(dtype):
    a = _spd(2, dtype=dtype)
    check(torch.linalg.cholesky, a)
    check(lambda x: torch.linalg.cholesky(x, upper=True), a)
    check(torch.linalg.cholesky_ex, a)
    check(torch.cholesky, a)
    check(lambda x: torch.cholesky(x, upper=True), a)
    low, b = torch.linalg.cholesky(a), _rand(2, 4, 3, dtype=dtype, seed=1)
    check(torch.cholesky_solve, b, low)
    check(lambda x, y: torch.cholesky_solve(x, y, upper=True), b, low.mT)
    check(torch.cholesky_inverse, low[0])
    check(lambda x: torch.cholesky_inverse(x, upper=True), low[0].mT)


def test_cholesky_reads_one_triangle_and_flags_failure():
    a = _spd(dtype=torch.float64)
    junk = a.tril() + 5 * torch.ones(4, 4, dtype=torch.float64).triu(1)  # upper part ignored
    check(torch.linalg.cholesky, junk)
    bad = torch.tensor([[1.0, 2.0], [2.0, 1.0]])
    assert _tpu_call(lambda x: torch.linalg.cholesky_ex(x).info, bad).item() == 2


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_info_is_the_order_of_the_first_failing_minor(upper):
    """LAPACK's info (XLA only says a factor failed: it was n for every failure)."""
    semi = torch.tensor([[4.0, 2, 0, 0], [2, 1, 0, 0], [0, 0, 3, 0], [0, 0, 0, 1]])
    batch = torch.stack([torch.eye(4), semi, torch.diag(torch.tensor([1.0, 2, -1, 4])),
                         -torch.eye(4), _spd(dtype=torch.float32)])
    z = torch.tensor([[1, 2j], [-2j, 1]], dtype=torch.complex64)
    for m in (batch, batch.double(), batch[1], z):
        check(lambda x: torch.linalg.cholesky_ex(x, upper=upper).info, m)
    with pytest.raises(RuntimeError, match="leading minor of order 2 is not positive-definite"):
        torch.linalg.cholesky(semi.to("tpu"), upper=upper)


@pytest.mark.parametrize("dtype", LA_DTYPES)
def test_triangular_solves(dtype):
    a = _well_conditioned(2, dtype=dtype)      # full matrices: only one triangle is read
    b = _rand(2, 4, 3, dtype=dtype, seed=1)
    for upper in (True, False):
        check(lambda x, y: torch.linalg.solve_triangular(x, y, upper=upper), a, b)
        check(lambda x, y: torch.linalg.solve_triangular(x, y, upper=upper, left=False), a, b.mT)
        check(lambda x, y: torch.linalg.solve_triangular(x, y, upper=upper, unitriangular=True), a, b)
        check(lambda x, y: torch.triangular_solve(y, x, upper=upper), a, b)
        check(lambda x, y: torch.triangular_solve(y, x, upper=upper, transpose=True), a[0], b)
    check(lambda x, y: torch.linalg.solve_triangular(x, y, upper=True), a[0], b)   # broadcast


def test_solve_triangular_grad():
    a = _well_conditioned(n=3).triu().requires_grad_()
    b = _rand(3, 2, seed=1).requires_grad_()
    check(lambda x, y: torch.linalg.solve_triangular(x, y, upper=True), a, b, grad=True)


def _close(actual, expected, dtype=torch.float64):
    torch.testing.assert_close(actual.cpu(), expected, atol=1e-6 if dtype == torch.float64 else 1e-4,
                               rtol=1e-6 if dtype == torch.float64 else 1e-4)


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
def test_qr_properties(shape):
    """QR's signs are LAPACK's choice on CPU but may differ under XLA: test the factorization."""
    a = _rand(*shape, dtype=torch.float64)
    ta = to_tpu(a)
    for mode in ("reduced", "complete"):
        q, r = torch.linalg.qr(ta, mode=mode)
        eq, er = torch.linalg.qr(a, mode=mode)
        assert q.shape == eq.shape and r.shape == er.shape
        q, r = q.cpu(), r.cpu()
        _close(q @ r, a)
        _close(q.mT @ q, torch.eye(q.shape[-1], dtype=a.dtype).expand_as(q.mT @ q))
        _close(r, r.triu())
    q, r = torch.linalg.qr(ta, mode="r")
    assert q.shape == (0,) and r.shape == torch.linalg.qr(a, mode="r")[1].shape
    h, tau = torch.geqrf(ta)
    m, n = shape[-2:]
    k = min(m, n)
    q = torch.linalg.householder_product(h[..., :, :k], tau)
    _close(q.cpu() @ h.cpu()[..., :k, :].triu(), a)
    c = _rand(*shape[:-2], m, 2, dtype=torch.float64, seed=3)
    eh, etau = torch.geqrf(a)
    check(lambda x, t, y: torch.ormqr(x, t, y), eh, etau, c)
    check(lambda x, t, y: torch.ormqr(x, t, y, transpose=True), eh, etau, c)
    check(lambda x, t: torch.linalg.householder_product(x, t), eh[..., :, :k], etau)


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
def test_svd_properties(shape):
    """Singular vectors are unique only up to sign (phase): test values and reconstruction."""
    a = _rand(*shape, dtype=torch.float64)
    u, s, vh = torch.linalg.svd(to_tpu(a), full_matrices=False)
    _close(s, torch.linalg.svdvals(a))
    _close(u.cpu() @ torch.diag_embed(s.cpu()) @ vh.cpu(), a)
    u, s, vh = torch.linalg.svd(to_tpu(a), full_matrices=True)
    eu, _, evh = torch.linalg.svd(a, full_matrices=True)
    assert u.shape == eu.shape and vh.shape == evh.shape
    _close(u.cpu().mT @ u.cpu(), torch.eye(u.shape[-1], dtype=a.dtype).expand(u.shape))
    check(torch.linalg.svdvals, a)


@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh_properties(uplo):
    """Eigenvector signs may differ from LAPACK's: test values and A V = V diag(w)."""
    a = _spd(2, dtype=torch.float64) - 4 * torch.eye(4, dtype=torch.float64)
    junk = a.tril() if uplo == "L" else a.triu()   # torch reads only the UPLO triangle
    w, v = torch.linalg.eigh(to_tpu(junk), UPLO=uplo)
    _close(w, torch.linalg.eigvalsh(a))
    _close(a @ v.cpu(), v.cpu() * w.cpu()[..., None, :])
    check(lambda x: torch.linalg.eigvalsh(x, UPLO=uplo), junk)


def test_eig_properties():
    """Complex eigenpairs: compare sorted values and test A V = V diag(w)."""
    a = _rand(4, 4, dtype=torch.float64)
    w, v = torch.linalg.eig(to_tpu(a))
    ew = torch.linalg.eigvals(a)
    assert w.dtype == ew.dtype and v.dtype == ew.dtype
    key = lambda z: torch.sort(z.real * 1000 + z.imag)[0]  # noqa: E731
    _close(key(w.cpu()), key(ew))
    ac = a.to(torch.complex128)
    torch.testing.assert_close(ac @ v.cpu(), v.cpu() * w.cpu()[None, :])


def test_pinv_lstsq_matrix_exp_cross():
    a = _rand(5, 3, dtype=torch.float64)
    check(torch.linalg.pinv, a)
    check(lambda x: torch.linalg.pinv(x, atol=0.5), a)
    check(lambda x: torch.linalg.pinv(x, rtol=0.3), _rand(2, 3, 4, dtype=torch.float64))
    check(lambda x: torch.linalg.pinv(x, hermitian=True), _spd(n=3))
    b = _rand(5, 2, dtype=torch.float64, seed=1)
    for driver in (None, "gelsd", "gelss"):
        check(lambda x, y: torch.linalg.lstsq(x, y, driver=driver), a, b)
    check(lambda x, y: torch.linalg.lstsq(x, y, driver="gels").solution, a, b)
    check(torch.linalg.matrix_exp, _rand(2, 3, 3, dtype=torch.float64) / 3)
    check(torch.linalg.matrix_exp, _rand(4, 4))
    check(torch.linalg.cross, _rand(4, 3), _rand(4, 3, seed=1))
    check(lambda x, y: torch.linalg.cross(x, y, dim=1), _rand(2, 3, 5), _rand(1, 3, 5, seed=1))


# -- grouped matmul ----------------------------------------------------------------------------------
def _offs(*ends):
    return torch.tensor(ends, dtype=torch.int32)


def test_grouped_mm():
    # torch wants bf16 operands (its meta function refuses f32) and 16-byte aligned strides
    g = lambda *s, seed=0: _rand(*s, dtype=torch.bfloat16, seed=seed)  # noqa: E731
    gmm = aten._grouped_mm
    check(gmm, g(16, 8), g(3, 8, 8, seed=1), _offs(2, 2, 16))                    # an empty group
    check(gmm, g(8, 32), g(32, 8, seed=1), _offs(8, 8, 32))
    check(gmm, g(3, 8, 16), g(16, 24, seed=1), _offs(8, 16, 24))
    check(gmm, g(2, 8, 16), g(2, 16, 8, seed=1))


def test_grouped_mm_grad():
    a = _rand(16, 8, dtype=torch.bfloat16).requires_grad_()
    b = _rand(2, 8, 8, dtype=torch.bfloat16, seed=1).requires_grad_()
    check(aten._grouped_mm, a, b, _offs(8, 16), grad=True)


# -- FFT (registry/xla/fft.py) -------------------------------------------------------------------------
@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
def test_fft(norm):
    x = _rand(4, 6)
    z = _rand(4, 6, dtype=torch.complex64)
    check(lambda a: torch.fft.fft(a, norm=norm), z)
    check(lambda a: torch.fft.ifft(a, norm=norm), z)
    check(lambda a: torch.fft.fft2(a, norm=norm), z)
    check(lambda a: torch.fft.fftn(a, dim=0, norm=norm), z.t())          # non-contiguous
    check(lambda a: torch.fft.rfft(a, norm=norm), x)
    check(lambda a: torch.fft.rfft2(a, norm=norm), _rand(3, 5, dtype=torch.float64))
    check(lambda a: torch.fft.fft(a, norm=norm), x)                       # r2c, two-sided
    check(lambda a: torch.fft.irfft(a, norm=norm), z)
    check(lambda a: torch.fft.irfft(a, n=7, norm=norm), z)
    check(lambda a: torch.fft.irfftn(a, norm=norm), z)


def test_hfft():  # hfft is _fft_c2r(x.conj()): needs the runtime's conj views
    check(lambda a: torch.fft.hfft(a), _rand(4, 6, dtype=torch.complex64))


def test_fft_grad():
    check(lambda a: torch.fft.rfft(a).abs(), _rand(3, 8).requires_grad_(), grad=True)


SINGULAR = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
CHECKED = {  # calls whose failure torch raises (through aten._linalg_check_errors)
    "solve": lambda a: torch.linalg.solve(a, torch.ones(*a.shape[:-1], 1, device=a.device)),
    "cholesky": torch.linalg.cholesky,
    "inv": torch.linalg.inv,
    "inverse": torch.inverse,
}


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("call", list(CHECKED))
def test_a_failed_linalg_call_raises_as_torch_does(call, batched):
    """Eager: the error code is read at once (a host sync, as on CUDA), so the exception,
    its type and torch's message come from the call itself."""
    a = torch.stack([torch.eye(2), SINGULAR]) if batched else SINGULAR
    with pytest.raises(torch.linalg.LinAlgError) as want:
        CHECKED[call](a)
    with pytest.raises(torch.linalg.LinAlgError) as got:
        CHECKED[call](a.to("tpu"))
    assert str(got.value) == str(want.value)
    CHECKED[call](torch.eye(2, device="tpu") * 2)      # a good matrix raises nothing


def test_a_failed_linalg_call_in_compiled_code_raises_by_the_next_sync():
    """Compiled: a device-side check, raised at a synchronisation (the call's own, or the
    next read); a good matrix raises nothing."""
    torch._dynamo.reset()
    cholesky = torch.compile(torch.linalg.cholesky, backend="tpu")
    cholesky(torch.eye(2, device="tpu") * 4).cpu()
    with pytest.raises(torch.linalg.LinAlgError, match="linalg.cholesky: The factorization could not"):
        cholesky(SINGULAR.to("tpu")).cpu()
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", LA_DTYPES)
def test_ldl_factor_and_solve_match_lapack(dtype):
    """Bunch-Kaufman LDL^T: LAPACK's own pivots and packed blocks (linalg_host.py runs
    torch's CPU kernel from inside the program), batched, Hermitian too."""
    a = _rand(2, 5, 5, dtype=dtype)
    a = a + a.mT
    b = _rand(2, 5, 3, dtype=dtype, seed=1)
    check(torch.linalg.ldl_factor_ex, a)
    check(lambda x: torch.linalg.ldl_factor(x)[0], a)
    check(lambda x, y: torch.linalg.ldl_solve(*torch.linalg.ldl_factor(x), y), a, b)
    if dtype.is_complex:
        h = a + a.mH
        check(lambda x: torch.linalg.ldl_factor_ex(x, hermitian=True), h)
        check(lambda x, y: torch.linalg.ldl_solve(*torch.linalg.ldl_factor(x, hermitian=True), y, hermitian=True), h, b)


def test_ldl_in_a_compiled_function_and_for_a_tpu_chip():
    from tpu_kernels import aot
    a = _rand(4, 4, dtype=torch.float32)
    a, b = a + a.mT, _rand(4, 2, dtype=torch.float32, seed=1)
    f = lambda x, y: torch.linalg.ldl_solve(*torch.linalg.ldl_factor(x), y)
    torch.testing.assert_close(torch.compile(f, backend="tpu")(*to_tpu((a, b))).cpu(), f(a, b))
    if aot.unavailable_reason() is not None:
        pytest.skip(str(aot.unavailable_reason()))
    x, y = to_tpu((a, b))
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        out = f(x, y)
    g.replay()
    torch.testing.assert_close(out.cpu(), f(a, b))
    compiled = aot.compile_lowered(lambda: g.lower(aot.on_chip(g.input_specs(), "v5e")), "v5e")
    assert compiled.summary.output_bytes > 0     # the host callback compiles for the chip
