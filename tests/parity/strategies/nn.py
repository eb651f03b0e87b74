"""Matmuls, normalisation, convolution and pooling."""
from __future__ import annotations


from hypothesis import strategies as st


from strategies.base import (Case, F32, FLOATS, INTS, Unsupported, broadcast_to, dtypes, max_numel, numel,
    shapes, tensors)

# -- matmul family ------------------------------------------------------------------------------
MM_SIZES = [0, 1, 2, 3, 7, 8, 16, 33, 128]


@st.composite
def matmul(draw, op, allowed=FLOATS + INTS):
    name = str(op).split(".")[1]
    dtype = draw(dtypes(allowed))
    m, k, n = (draw(st.sampled_from(MM_SIZES)) for _ in range(3))
    b = draw(st.sampled_from([0, 1, 2, 3]))
    while m * k * n * max(b, 1) > 4 * max_numel():
        m, k, n = max(1, m // 4), max(1, k // 2), max(1, n // 4)

    def t(*shape):
        return draw(tensors(shape, dtype, special=False))

    ab = {}
    if dtype.is_floating_point:
        ab = {"beta": draw(st.sampled_from([1, 0.5, 0])), "alpha": draw(st.sampled_from([1, 2.0]))}
    else:
        ab = {"beta": draw(st.sampled_from([1, 0])), "alpha": draw(st.sampled_from([1, 2]))}
    if name == "mm":
        return Case((t(m, k), t(k, n)))
    if name == "bmm":
        return Case((t(b, m, k), t(b, k, n)))
    if name == "addmm":
        return Case((t(*draw(broadcast_to((m, n)))), t(m, k), t(k, n)), ab)
    if name == "baddbmm":
        return Case((t(*draw(broadcast_to((b, m, n)))), t(b, m, k), t(b, k, n)), ab)
    if name == "addbmm":
        return Case((t(*draw(broadcast_to((m, n)))), t(b, m, k), t(b, k, n)), ab)
    if name == "addmv":
        return Case((t(*draw(broadcast_to((m,)))), t(m, k), t(k)), ab)
    if name == "addr":
        return Case((t(*draw(broadcast_to((m, n)))), t(m), t(n)), ab)
    if name == "mv":
        return Case((t(m, k), t(k)))
    if name in ("dot", "vdot"):
        return Case((t(k), t(k)))
    raise Unsupported(name)


# -- normalisation ----------------------------------------------------------------------------------
@st.composite
def norm(draw, op):
    name = str(op).split(".")[1]
    dtype = draw(dtypes(FLOATS))
    eps = draw(st.sampled_from([1e-5, 1e-3]))

    def t(shape, **kw):
        return draw(tensors(shape, dtype, special=False, **kw))
    if name == "native_layer_norm":
        shape = draw(shapes(min_dims=1, max_dims=3))
        k = draw(st.integers(1, len(shape)))
        ns = list(shape[len(shape) - k:])
        w = t(ns) if draw(st.booleans()) else None
        b = t(ns) if draw(st.booleans()) else None
        return Case((t(shape), ns, w, b, eps))
    if name == "_fused_rms_norm":
        shape = draw(shapes(min_dims=1, max_dims=3))
        k = draw(st.integers(1, len(shape)))
        ns = list(shape[len(shape) - k:])
        w = t(ns) if draw(st.booleans()) else None
        return Case((t(shape), ns, w, draw(st.sampled_from([None, 1e-6]))))
    if name == "native_group_norm":
        g = draw(st.sampled_from([1, 2, 3]))
        c = g * draw(st.sampled_from([1, 2, 4]))
        n = draw(st.sampled_from([1, 2, 3]))
        hw = draw(st.sampled_from([(1,), (5,), (4, 4), (3, 7)]))
        w = t([c]) if draw(st.booleans()) else None
        b = t([c]) if draw(st.booleans()) else None
        return Case((t((n, c) + hw), w, b, n, c, numel(hw), g, eps))
    if name == "_weight_norm_interface":
        shape = draw(shapes(min_dims=1, max_dims=3, min_side=1))
        dim = draw(st.integers(0, len(shape) - 1))
        gshape = [s if i == dim else 1 for i, s in enumerate(shape)]
        return Case((t(shape), t(gshape, values="positive"), dim))
    # batch norms
    n = draw(st.sampled_from([2, 3, 8]))
    c = draw(st.sampled_from([1, 3, 16]))
    rest = draw(st.sampled_from([(), (5,), (4, 4)]))
    x = t((n, c) + rest)
    w = t([c]) if draw(st.booleans()) else None
    b = t([c]) if draw(st.booleans()) else None
    stat_dtype = F32 if dtype != F32 and draw(st.booleans()) else dtype
    rm = draw(tensors([c], stat_dtype, special=False, layout="contiguous"))
    rv = draw(tensors([c], stat_dtype, values="positive", layout="contiguous"))
    mom = draw(st.sampled_from([0.1, 0.5]))
    if name == "native_batch_norm":
        training = draw(st.booleans())
        use_stats = draw(st.booleans()) or not training
        return Case((x, w, b, rm if use_stats else None, rv if use_stats else None, training, mom, eps))
    if name == "_native_batch_norm_legit":
        if str(op).endswith("no_stats"):
            return Case((x, w, b, True, mom, eps))
        return Case((x, w, b, rm, rv, draw(st.booleans()), mom, eps))
    if name == "_native_batch_norm_legit_no_training":
        return Case((x, w, b, rm, rv, mom, eps))
    if name in ("_batch_norm_with_update", "_batch_norm_with_update_functional", "_batch_norm_no_update"):
        return Case((x, w, b, rm, rv, mom, eps))
    raise Unsupported(name)


# -- convolution and pooling -----------------------------------------------------------------------
@st.composite
def conv(draw, op):
    name = str(op).split(".")[1]
    dtype = draw(dtypes(FLOATS))
    nd = draw(st.sampled_from([1, 2, 2, 3]))
    if name == "convolution":
        groups = draw(st.sampled_from([1, 1, 2]))
        cin = groups * draw(st.sampled_from([1, 3]))
        cout = groups * draw(st.sampled_from([1, 2, 4]))
        n = draw(st.sampled_from([1, 2]))
        k = [draw(st.sampled_from([1, 2, 3])) for _ in range(nd)]
        stride = [draw(st.sampled_from([1, 2])) for _ in range(nd)]
        pad = [draw(st.sampled_from([0, 1])) for _ in range(nd)]
        dil = [draw(st.sampled_from([1, 2])) for _ in range(nd)]
        transposed = draw(st.booleans())
        size = [draw(st.sampled_from([5, 7, 8] if nd < 3 else [4, 5])) for _ in range(nd)]
        for i in range(nd):  # the input must cover the dilated kernel
            size[i] = max(size[i], dil[i] * (k[i] - 1) + 1)
        x = draw(tensors((n, cin, *size), dtype, special=False))
        if transposed:
            outp = [draw(st.integers(0, max(0, min(stride[i], dil[i]) - 1))) for i in range(nd)]
            w = draw(tensors((cin, cout // groups, *k), dtype, special=False))
        else:
            outp = [0] * nd
            w = draw(tensors((cout, cin // groups, *k), dtype, special=False))
        bias = draw(tensors((cout,), dtype, special=False)) if draw(st.booleans()) else None
        return Case((x, w, bias, stride, pad, dil, transposed, outp, groups))
    if name in ("im2col", "col2im"):
        k = [draw(st.sampled_from([1, 2, 3])) for _ in range(2)]
        dil = [draw(st.sampled_from([1, 2])) for _ in range(2)]
        pad = [draw(st.sampled_from([0, 1])) for _ in range(2)]
        stride = [draw(st.sampled_from([1, 2])) for _ in range(2)]
        size = [draw(st.sampled_from([5, 7, 8])) for _ in range(2)]
        c = draw(st.sampled_from([1, 3]))
        n = draw(st.sampled_from([1, 2]))
        if name == "im2col":
            return Case((draw(tensors((n, c, *size), dtype)), k, dil, pad, stride))
        blocks = [(size[i] + 2 * pad[i] - dil[i] * (k[i] - 1) - 1) // stride[i] + 1 for i in range(2)]
        if min(blocks) < 1:
            raise Unsupported("no blocks")
        cols = draw(tensors((n, c * k[0] * k[1], blocks[0] * blocks[1]), dtype))
        return Case((cols, size, k, dil, pad, stride))
    raise Unsupported(name)


@st.composite
def pool(draw, op):
    name = str(op).split(".")[1]
    dtype = draw(dtypes(FLOATS))
    nd = 3 if "3d" in name else 1 if "1d" in name else 2
    n_batch = draw(st.sampled_from([(), (1,), (2,)]))
    c = draw(st.sampled_from([1, 3]))
    size = [draw(st.sampled_from([4, 5, 7, 8] if nd < 3 else [3, 4, 5])) for _ in range(nd)]
    x = draw(tensors(n_batch + (c, *size), dtype, values="distinct" if "max" in name else None))
    if name.startswith("_adaptive") or name.startswith("adaptive"):
        out = [draw(st.integers(1, s + 1)) for s in size]
        return Case((x, out))
    k = [draw(st.sampled_from([1, 2, 3])) for _ in range(nd)]
    stride = [draw(st.sampled_from([1, 2, 3])) for _ in range(nd)] if draw(st.booleans()) else []
    pad = [draw(st.integers(0, kk // 2)) for kk in k]
    ceil = draw(st.booleans())
    if name.startswith("max_pool"):
        dil = [draw(st.sampled_from([1, 2])) for _ in range(nd)]
        for i in range(nd):
            if dil[i] * (k[i] - 1) + 1 > size[i] + 2 * pad[i]:
                dil[i] = 1
        return Case((x, k, stride, pad, dil, ceil))
    if name.startswith("avg_pool"):
        cip = draw(st.booleans())
        if nd == 1:
            return Case((x, k, stride, pad, ceil, cip))
        div = draw(st.sampled_from([None, None, 3]))
        return Case((x, k, stride, pad, ceil, cip, div))
    if name.startswith("fractional_max_pool"):
        k = [draw(st.sampled_from([1, 2])) for _ in range(nd)]
        out = [draw(st.integers(1, s - kk + 1)) for s, kk in zip(size, k)]
        nb = n_batch[0] if n_batch else 1
        samples = draw(tensors((nb, c, nd), dtype, values="prob", layout="contiguous"))
        return Case((x, k, out, samples), compare="values", grad=False)
    raise Unsupported(name)
