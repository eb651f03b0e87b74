"""Dispatch machinery: caching, forcing kinds, unsupported ops, CPU fallback, views."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

from tpu_kernels import dispatch, registry
from tpu_kernels.registry import tpu_kernel, unregister


def test_same_signature_traces_once():
    x = torch.randn(5, 7, device="tpu")
    y = torch.randn(5, 7, device="tpu")
    op = torch.ops.aten.mul.Tensor
    x * y
    before = dispatch.TRACES.get(op, 0)
    for _ in range(5):
        x * y
    assert dispatch.TRACES.get(op, 0) == before
    torch.randn(6, 7, device="tpu") * torch.randn(6, 7, device="tpu")   # new shape: one more trace
    assert dispatch.TRACES.get(op, 0) == before + 1


def test_new_scalar_values_do_not_retrace():
    x = torch.randn(4, device="tpu")
    op = torch.ops.aten.add.Tensor
    x + 1.5
    before = dispatch.TRACES.get(op, 0)
    for v in (2.5, 3.25, -1.0):
        assert torch.allclose((x + v).cpu(), x.cpu() + v)
    assert dispatch.TRACES.get(op, 0) == before


def test_unsupported_op_error_names_op_and_fallback():
    @tpu_kernel("mylib_test::needs_impl", reference=lambda x: x + 1)
    def needs_impl(x: torch.Tensor) -> torch.Tensor:
        return x + 1
    with registry.disable("user"):
        with pytest.raises(NotImplementedError, match="(?s)needs_impl.*TPU_KERNELS_CPU_FALLBACK"):
            needs_impl(torch.ones(2, device="tpu"))


def test_cpu_fallback_runs_and_warns_once(monkeypatch):
    monkeypatch.setenv("TPU_KERNELS_CPU_FALLBACK", "1")

    @tpu_kernel("mylib_test::fallback_me", reference=lambda x: x * 3)
    def fallback_me(x: torch.Tensor) -> torch.Tensor:
        return x * 3
    with registry.disable("user"), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = fallback_me(torch.ones(2, device="tpu"))
        out2 = fallback_me(torch.ones(2, device="tpu"))
    assert out.device.type == "tpu" and out.cpu().tolist() == [3.0, 3.0]
    assert out2.cpu().tolist() == [3.0, 3.0]
    assert sum("CPU" in str(w.message) for w in seen) == 1


def test_user_kernel_wins_and_can_be_forced_off():
    calls = []

    @tpu_kernel("aten::neg", supports=lambda x: x.dtype == torch.float32)
    def my_neg(x):
        calls.append(1)
        return -x
    try:
        x = torch.randn(3, device="tpu")
        assert torch.equal((-x).cpu(), -(x.cpu()))
        assert calls, "user kernel did not run"
        n = len(calls)
        -(x.to(torch.bfloat16))             # predicate refuses bf16: built-in runs
        with registry.only("xla"):
            -torch.randn(4, device="tpu")   # user kind disabled
        assert len(calls) == n
        impl, skipped = registry.which("aten::neg", torch.randn(2, dtype=torch.bfloat16))
        assert impl.kind == "xla" and any("False" in r for _, r in skipped)
    finally:
        unregister(my_neg)


def test_register_twice_needs_override():
    def twice(x):
        return x
    tpu_kernel("aten::abs")(twice)
    try:
        with pytest.raises(ValueError, match="override=True"):
            tpu_kernel("aten::abs")(twice)
        tpu_kernel("aten::abs", override=True)(twice)
    finally:
        unregister(twice)


def test_decorator_misuse():
    with pytest.raises(ValueError, match="unknown op"):
        tpu_kernel("aten::not_an_op")(lambda x: x)
    with pytest.raises(ValueError, match="namespace"):
        tpu_kernel("fused_thing")(lambda x: x)
    with pytest.raises(TypeError, match="type hints"):
        tpu_kernel("mylib_test::no_hints")(lambda x: x)
    with pytest.raises(TypeError, match="positional"):
        tpu_kernel("aten::add.Tensor")(lambda x: x)
    with pytest.raises(ValueError, match="several overloads"):
        tpu_kernel("aten::scatter")(lambda x, dim, index, src: x)


def test_env_disable_kinds(monkeypatch):
    with registry.disable("xla"):
        with pytest.raises(NotImplementedError):
            torch.ones(3, device="tpu") * torch.ones(3, device="tpu")
    assert (torch.ones(3, device="tpu") * 2).cpu().tolist() == [2, 2, 2]
    with pytest.raises(ValueError, match="unknown impl kind"):
        with registry.disable("cuda"):
            pass


def test_fast_index_keys_static_values_number_types_and_settings():
    """Calls that hit the hot path's FAST index (positional tensors and numbers) still
    tell apart what changes the executable: a static argument's value (softmax's dim), a
    number's type (int vs float vs bool promote differently), and the matmul precision."""
    x = torch.arange(12.0).reshape(3, 4)
    t = x.to("tpu")
    for _ in range(2):   # the second round runs through the FAST index
        for dim in (0, 1, -1):
            torch.testing.assert_close(t.softmax(dim).cpu(), x.softmax(dim))
        i = torch.arange(6)
        ti = i.to("tpu")
        for other in (2, 2.5, True):
            got, want = (ti * other).cpu(), i * other
            assert got.dtype == want.dtype and torch.equal(got, want), other
    a = torch.randn(8, 8).to("tpu")
    old = torch.get_float32_matmul_precision()
    try:
        (a @ a).cpu()
        (a @ a).cpu()
        before = dispatch.TRACES.get(torch.ops.aten.mm.default, 0)
        torch.set_float32_matmul_precision("medium" if old != "medium" else "highest")
        (a @ a).cpu()
    finally:
        torch.set_float32_matmul_precision(old)
    assert dispatch.TRACES.get(torch.ops.aten.mm.default, 0) == before + 1


def test_views_read_inside_their_consumer():
    """A view's read happens inside the program of the op that takes it (its storage's
    array goes in, its geometry is part of the signature): transposed, sliced with an
    offset, expanded, bit-cast and overlapping (a gather, read apart) views all give
    torch's values, and a view and a whole tensor of the same shape never share a FAST
    entry."""
    x = torch.arange(24.0).reshape(4, 6)
    t = x.to("tpu")
    views = {"transposed": lambda a: a.t(), "sliced": lambda a: a[1:3, 2:5], "expanded": lambda a: a[:1].expand(3, 6),
             "reshaped": lambda a: a.view(6, 4), "bitcast": lambda a: a.view(torch.int32),
             "overlapping": lambda a: a.as_strided((3, 3), (1, 1), 2)}
    for _ in range(2):   # the second round runs through the FAST index
        for name, view in views.items():
            got, want = torch.maximum(view(t), view(t).neg()), torch.maximum(view(x), view(x).neg())
            assert got.dtype == want.dtype and torch.equal(got.cpu(), want), name
        for shape_twin in (t[:, :4].contiguous(), t[:, :4], t[:, 2:]):   # same shape: whole, then views
            torch.testing.assert_close((shape_twin * 2).cpu(), shape_twin.cpu() * 2)
    w = torch.randn(5, 3).to("tpu")
    before = dispatch.TRACES.get(torch.ops.aten.mm.default, 0)
    y = t[:, :3] @ w.t()   # two views into one mm: its program reads both
    torch.testing.assert_close(y.cpu(), x[:, :3] @ w.cpu().t())
    assert dispatch.TRACES.get(torch.ops.aten.mm.default, 0) == before + 1


def test_fast_index_follows_a_tensors_geometry_through_in_place_changes():
    """The FAST index keys a tensor on a token of its geometry kept on the tensor: an
    in-place change of sizes or strides (a transpose, resize, ``.data`` swap) makes it a
    new geometry, so later hot-path calls see the tensor as it is now."""
    changes = {"t_": lambda a: a.t_(), "unsqueeze_": lambda a: a.unsqueeze_(0),
               "resize_": lambda a: a.resize_(2, 3), "as_strided_": lambda a: a.as_strided_((3, 4), (1, 3)),
               "data": lambda a: setattr(a, "data", torch.arange(15.0).reshape(3, 5).to(a.device)),
               "swap_tensors": lambda a: torch.utils.swap_tensors(a, torch.ones(2, 5, device=a.device))}
    for name, change in changes.items():
        x = torch.arange(24.0).reshape(4, 6)
        t = x.to("tpu")
        for _ in range(2):   # the second round runs through the FAST index
            t + t * 2
        change(x), change(t)
        for _ in range(2):
            got, want = t + t * 2, x + x * 2
            assert got.shape == want.shape and got.stride() == want.stride(), name
            assert torch.equal(got.cpu(), want), name


def test_fast_hit_falls_back_when_its_settled_executable_refuses_the_arrays():
    """The hot path calls a signature's settled executable directly; one that refuses the
    arrays with a TypeError (arrays of another weak type) hands the call to the
    signature's own function, which gives the result."""
    import importlib

    from tpu_kernels.dispatch import cache
    run = importlib.import_module("tpu_kernels.dispatch.run")
    a = torch.randn(3, 5).to("tpu")
    a - a, a - a   # the second call is a FAST hit
    op = torch.ops.aten.sub.Tensor
    compiled = cache.FAST[run.fast_key(run._state(op), (a, a))][0]

    def refuse(*arrays):
        raise TypeError("argument types differ from the types the executable was compiled for")
    settled, compiled.call = compiled.call, refuse
    try:
        torch.testing.assert_close((a - a).cpu(), torch.zeros(3, 5))
    finally:
        compiled.call = settled


def test_foreach_and_list_ops_run_through_the_fast_index(monkeypatch):
    """A call taking tensor lists (the foreach ops, cat, stack) or number lists is keyed in
    the FAST index like one of single tensors: its second call skips the signature path,
    views in a list are read as views, writes land in their bases, and an int list and a
    float list still promote differently."""
    import importlib
    run = importlib.import_module("tpu_kernels.dispatch.run")
    xs = [torch.arange(12.0).reshape(3, 4), torch.arange(8.0).reshape(4, 2), -torch.arange(5.0)]
    calls = {
        "add": lambda v: torch._foreach_add([v[0].t(), v[1][1:], v[2]], [v[0].t(), v[1][1:], v[2]]),
        "mul numbers": lambda v: torch._foreach_mul(v, [1.5, 2, True]),
        "addcmul_ into views": lambda v: torch._foreach_addcmul_([v[0].t(), v[1][1:]], [v[0].t(), v[1][1:]],
                                                                 [v[0].t(), v[1][1:]], 0.5) or v,
        "cat": lambda v: [torch.cat([v[0], v[0]], 1)],
        "stack": lambda v: [torch.stack([v[1], v[1] * 2])],
        "int list": lambda v: torch._foreach_mul([torch.arange(4, device=v[0].device)], [2]),
        "float list": lambda v: torch._foreach_mul([torch.arange(4, device=v[0].device)], [2.5]),
    }
    slow = []
    call_slow = run.run_call
    for rnd in range(2):   # the second round runs through the FAST index
        if rnd:
            monkeypatch.setattr(run, "run_call", lambda op, a, k: slow.append(str(op)) or call_slow(op, a, k))
        for name, call in calls.items():
            want = call([x.clone() for x in xs])
            got = call([x.to("tpu") for x in xs])
            assert len(got) == len(want), name
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and torch.equal(g.cpu(), w), name
    assert not [op for op in slow if "foreach" in op or "cat" in op or "stack" in op], slow


def test_static_scalars_bool_lists_and_plain_keywords_run_through_the_fast_index(monkeypatch):
    """An impl that reads a scalar's value (SDPA's ``dropout_p``), a bool list (layer
    norm's backward output mask) and keyword arguments that are None or numbers (SDPA's
    backward: ``attn_mask=None``) are keyed in the FAST index by value, a keyword number
    that is a leaf (``scale=0.3``) by type: the training step's second round skips the
    signature path for them, and values still match CPU."""
    import importlib
    run = importlib.import_module("tpu_kernels.dispatch.run")
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 4)
    ln = torch.nn.LayerNorm(4)
    tln = copy.deepcopy(ln).to("tpu")

    def step(x, ln, scale):
        q = x.clone().requires_grad_()
        y = torch.nn.functional.scaled_dot_product_attention(ln(q), q, q, is_causal=True, scale=scale)
        y.square().sum().backward()
        return y, q.grad, ln.weight.grad

    slow = []
    call_slow = run.run_call
    for rnd in range(2):
        if rnd:
            monkeypatch.setattr(run, "run_call", lambda op, a, k: slow.append(str(op)) or call_slow(op, a, k))
        for scale in (None, 0.3):
            ln.zero_grad(), tln.zero_grad()
            for g, w in zip(step(x.to("tpu"), tln, scale), step(x, ln, scale)):
                torch.testing.assert_close(g.cpu(), w, atol=1e-5, rtol=1e-5)
    assert "aten.native_layer_norm_backward.default" not in slow, slow
    for op in ("aten._scaled_dot_product_flash_attention_for_cpu.default",
               "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"):
        assert op not in slow, slow


def test_a_keyword_number_is_an_input_of_the_fast_index_hit(monkeypatch):
    """A fused optimizer's ``lr=`` (here ``_foreach_add_``'s ``alpha=``) is a leaf: a new
    value hits the FAST index (no signature path) and is the value the program uses."""
    import importlib
    run = importlib.import_module("tpu_kernels.dispatch.run")
    xs = [torch.zeros(3, device="tpu"), torch.zeros(2, 2, device="tpu")]
    ys = [torch.ones(3, device="tpu"), torch.ones(2, 2, device="tpu")]
    torch._foreach_add_(xs, ys, alpha=0.5)
    slow = []
    call_slow = run.run_call
    monkeypatch.setattr(run, "run_call", lambda op, a, k: slow.append(str(op)) or call_slow(op, a, k))
    for alpha in (0.25, 2.0):
        torch._foreach_add_(xs, ys, alpha=alpha)
    assert slow == [], slow
    for x in xs:
        assert torch.equal(x.cpu(), torch.full(x.shape, 2.75))


def test_a_view_from_the_fast_index_is_the_view_first_made():
    x = torch.randn(4, 6, device="tpu")
    makes = [lambda t: t.t(), lambda t: t.view(2, 12), lambda t: t[1:3], lambda t: t.transpose(0, 1)[2],
             lambda t: t.unsqueeze(0).expand(3, 4, 6), lambda t: t.view(torch.int32)]
    for make in makes:
        first, again = make(x), make(x)      # the second comes from views.FAST_VIEWS
        assert (again.shape, again.stride(), again.storage_offset(), again.dtype, again._tpu_direct) == \
            (first.shape, first.stride(), first.storage_offset(), first.dtype, first._tpu_direct)
        torch.testing.assert_close(again.cpu(), make(x.cpu()))
    empty = torch.empty(0, 3, device="tpu")
    for _ in range(2):      # an empty view keeps a torch storage torch.compile need not resize
        assert empty.t().untyped_storage().nbytes() > 0


def test_inference_mode():
    """Under ``torch.inference_mode()``: a view of a normal tensor is a normal tensor
    sharing its base's version counter (torch's rule), while a view of an inference tensor
    is one; composite ops that may copy (``to``, ``contiguous``, ``reshape``), which
    inference mode hands to the device whole, decompose as in plain eager; ``.item()``
    works; values match CPU."""
    x = torch.arange(12.0).reshape(3, 4)
    xt = x.to("tpu")
    with torch.inference_mode():
        v = xt.unsqueeze(0).expand(2, 3, 4)
        assert not v.is_inference()
        y = xt + 1
        assert y.is_inference() and y.t().is_inference()
        got = [v, y.t().contiguous(), xt.t().reshape(12), xt.to(torch.bool), xt.to(torch.int32).narrow(1, 1, 2),
               xt.flatten(), xt.unflatten(1, (2, 2))]
        want = [x.unsqueeze(0).expand(2, 3, 4), (x + 1).t().contiguous(), x.t().reshape(12), x.to(torch.bool),
                x.to(torch.int32).narrow(1, 1, 2), x.flatten(), x.unflatten(1, (2, 2))]
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.stride() == w.stride()
            assert torch.equal(g.cpu(), w)
        assert xt.sum().item() == 66.0
        labels = torch.tensor([[0, 2], [1, 3]])
        for n in (5, -1):      # one_hot comes whole too: an impl, and its decomposition for -1
            assert torch.equal(F.one_hot(labels.to("tpu"), n).cpu(), F.one_hot(labels, n))
        with pytest.raises(RuntimeError, match="Class values must be smaller than num_classes"):
            F.one_hot(labels.to("tpu"), 3).cpu()
        assert xt.detach_() is xt
    v2 = xt.view(12)
    xt.add_(1)                      # a normal tensor's views still see its writes
    assert torch.equal(v2.cpu(), x.view(12) + 1)


def test_the_default_dtype_is_part_of_every_cached_call():
    # a float meeting an integer tensor, and a factory without a dtype, take torch's default
    # dtype: a call cached (in memory, on disk, in the FAST index) under another must not answer
    x = torch.ones(2, dtype=torch.int64, device="tpu")
    for _ in range(2):
        assert (x * 1.5).dtype == torch.float32 and torch.zeros(2, device="tpu").dtype == torch.float32
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        for _ in range(2):
            assert (x * 1.5).dtype == torch.float64
            assert torch.zeros(2, device="tpu").dtype == torch.float64
            assert torch.arange(0.0, 2.0, device="tpu").dtype == torch.float64
    finally:
        torch.set_default_dtype(old)
