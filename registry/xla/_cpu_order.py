"""torch's CPU ``topk`` order, where the values alone do not fix it.

When values tie (or ``sorted=False``), which indices ``torch.topk`` returns, and in what
order, is whatever its CPU kernel's selection algorithm leaves behind: libstdc++'s
``std::nth_element`` then ``std::sort`` of the first ``k - 1`` elements, or
``std::partial_sort`` when ``k * 64 <= n`` (``aten/src/ATen/native/TopKImpl.h``). A MoE
router whose gate starts at zero (AFMoE) scores every expert the same, so a plain
"lowest index first" top-k routes tokens to other experts than CPU torch does.

This module replays those algorithms on each row, step for step, on (key, index) pairs
whose key order is torch's comparator (``comp(x, y) = key[x] > key[y]``):

    introselect(first, nth, last):            # nth_element
        while last - first > 3 and depth > 0: # depth = 2 * floor(log2(n))
            cut = partition(first, last)      # median-of-3 pivot moved to first, Hoare scan
            first, last = (cut, last) if cut <= nth else (first, cut)
        if last - first > 3: heap_select(first, nth + 1, last); swap(first, nth)
        else: insertion_sort(first, last)     # = a stable sort of the range

The Hoare scan is computed in closed form: the i-th "left stop" (an element not before the
pivot, scanning up) swaps with the i-th "right stop" (not after the pivot, scanning down)
while the pair has not crossed, so a partition is a few vector passes instead of a
sequential loop. Insertion sorts are stable sorts of their range. Only the heap routines
(``heap_select``, ``sort_heap``: the partial-sort path, and depth-limit fallbacks) run
element by element.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

# libstdc++'s std::sort leaves ranges of up to 16 elements to its final insertion sort
_SORT_THRESHOLD = 16


def _stable_sort_range(a, first, last):
    """Stable sort of positions [first, last) in comparator order (insertion sort's result)."""
    key, idx = a
    pos = jnp.arange(key.shape[0])
    seg = (pos >= first).astype(jnp.int32) + (pos >= last).astype(jnp.int32)
    inner = jnp.where(seg == 1, ~key, jnp.zeros_like(key))  # ascending ~key = descending key
    _, _, key, idx = jax.lax.sort((seg, inner, key, idx), num_keys=2, is_stable=True)
    return key, idx


def _exchange(a, i, j):
    """Swap positions i and j (a select per element: no scatter)."""
    pos = jnp.arange(a[0].shape[0])
    return tuple(jnp.where(pos == i, x[j], jnp.where(pos == j, x[i], x)) for x in a)


def _median_to_first(a, first, last):
    """std::__move_median_to_first(first, first + 1, mid, last - 1)."""
    key = a[0]
    pa, pb, pc = first + 1, first + (last - first) // 2, last - 1
    ka, kb, kc = key[pa], key[pb], key[pc]
    sel = jnp.where(ka > kb,
                    jnp.where(kb > kc, pb, jnp.where(ka > kc, pc, pa)),
                    jnp.where(ka > kc, pa, jnp.where(kb > kc, pc, pb)))
    return _exchange(a, first, sel)


def _stops(mask, pos, ascending: bool):
    """Positions where ``mask`` holds, in scan order, then padding (stable sort)."""
    order = pos if ascending else -pos
    return jax.lax.sort((~mask, order, pos), num_keys=2)[2]


def _partition(a, first, last):
    """std::__unguarded_partition_pivot on [first, last): (array, cut)."""
    a = _median_to_first(a, first, last)
    key = a[0]
    n = key.shape[0]
    p = key[first]
    pos = jnp.arange(n, dtype=jnp.int32)
    inside = (pos > first) & (pos < last)
    lstop = inside & (key <= p)            # !comp(x, pivot): the upward scan stops here
    rstop = inside & (key >= p)            # !comp(pivot, x): the downward scan stops here
    nl, nr = jnp.sum(lstop, dtype=jnp.int32), jnp.sum(rstop, dtype=jnp.int32)
    rank = jnp.arange(n, dtype=jnp.int32)
    # lpos[r] / rpos[r]: where the r-th stop of each scan is (n + 1 / -1 past the last)
    lpos = jnp.where(rank < nl, _stops(lstop, pos, True), n + 1)
    rpos = jnp.where(rank < nr, _stops(rstop, pos, False), -1)
    swapped = lpos < rpos                  # a prefix of the ranks: lpos rises, rpos falls
    m = jnp.sum(swapped, dtype=jnp.int32)
    # the scan that ends it: the next left stop, or the last right stop swapped into place
    next_l = jnp.where(m < nl, lpos[jnp.minimum(m, n - 1)], n + 1)
    cut = jnp.minimum(next_l, jnp.where(m > 0, rpos[jnp.maximum(m - 1, 0)], last))
    # the r-th left stop and the r-th right stop trade places, for r < m
    lrank = jnp.cumsum(lstop, dtype=jnp.int32) - 1
    rrank = jnp.cumsum(rstop[::-1], dtype=jnp.int32)[::-1] - 1
    to_r = lstop & (lrank < m)
    to_l = rstop & (rrank < m)
    perm = jnp.where(to_r, rpos[jnp.clip(lrank, 0, n - 1)],
                     jnp.where(to_l, lpos[jnp.clip(rrank, 0, n - 1)], pos))
    return (a[0][perm], a[1][perm]), cut


# -- heaps, element by element ------------------------------------------------------------------
def _heap(a, first, middle, last, sort_end):
    """std::__heap_select(first, middle, last) then std::__sort_heap(first, sort_end)
    (``sort_end`` is ``middle``, or ``first`` for no sort).

    One flat loop. Step t is one std::__adjust_heap call: make_heap's sift of parent t,
    the selection's pop for candidate ``middle + t``, or the sort's pop; each call runs
    as phase 0 (set up: a pop first moves the top to the vacated slot), phase 1 (sift the
    hole down to a leaf, with the even-length fix-up), phase 2 (push ``value`` back up)."""
    n = a[0].shape[0]
    length = middle - first
    parents = jnp.where(length >= 2, (length - 2) // 2 + 1, 0)
    picks = parents + (last - middle)
    total = picks + jnp.maximum(sort_end - first - 1, 0)
    z = jnp.zeros_like(first)

    def body(s):
        a, t, phase, hole, top, second, size, vk, vi = s
        key = a[0]
        # phase 0: the next call's hole, heap size and value
        make, pick = t < parents, (t >= parents) & (t < picks)
        cand = middle + (t - parents)
        end = middle - 1 - (t - picks)
        src = jnp.where(make, first + parents - 1 - t, jnp.where(pick, cand, end))
        start = (phase == 0) & (t < total)
        call = start & (make | ~pick | (key[cand] > key[first]))
        pre = jnp.where(call & ~make, src, n)                 # pop: the top moves out first
        # phase 1: one sift step, or the fix-up and the switch to pushing
        sift = (phase == 1) & (second < (size - 1) // 2)
        fix = (phase == 1) & ~sift & ((size & 1) == 0) & (second == (size - 2) // 2)
        right = 2 * (second + 1)
        child = jnp.where(fix | (key[first + right] > key[first + right - 1]), right - 1, right)
        # phase 2: move the parent down while it comes after the value, else place the value
        parent = jnp.where(hole > 0, (hole - 1) // 2, 0)
        up = (phase == 2) & (hole > top) & (key[first + parent] > vk)
        place = (phase == 2) & ~up
        dst = jnp.where(sift | fix | up, first + hole, jnp.where(place, first + hole, pre))
        frm = jnp.where(sift | fix, first + child, jnp.where(up, first + parent, first))
        a = tuple(x.at[dst].set(jnp.where(place, v, x[frm]), mode="drop") for x, v in zip(a, (vk, vi)))
        nk, ni = key[src], s[0][1][src]
        hole = jnp.where(call, jnp.where(make, parents - 1 - t, 0),
                         jnp.where(sift | fix, child, jnp.where(up, parent, hole)))
        top = jnp.where(call, hole, top)
        second = jnp.where(call, hole, jnp.where(sift, child, second))
        size = jnp.where(call, jnp.where(make | pick, length, end - first), size)
        vk, vi = jnp.where(call, nk, vk), jnp.where(call, ni, vi)
        phase = jnp.where(call, 1, jnp.where(phase == 1, jnp.where(sift, 1, 2),
                                             jnp.where(place | start, 0, phase))).astype(z.dtype)
        t = t + (place | (start & ~call)).astype(z.dtype)
        return a, t, phase, hole, top, second, size, vk, vi

    init = (a, z, z, z, z, z, z, jnp.zeros((), a[0].dtype), jnp.zeros((), a[1].dtype))
    return jax.lax.while_loop(lambda s: s[1] < total, body, init)[0]


# -- the three std:: algorithms ----------------------------------------------------------------------
def _lg2(n: int) -> int:
    return n.bit_length() - 1 if n > 0 else 0


def _nth_element(a, nth: int, n: int):
    def cond(s):
        _, first, last, depth = s
        return (last - first > 3) & (depth > 0)

    def body(s):
        a, first, last, depth = s
        a, cut = _partition(a, first, last)
        return a, jnp.where(cut <= nth, cut, first), jnp.where(cut <= nth, last, cut), depth - 1

    zero = jnp.zeros((), jnp.int32)
    a, first, last, _ = jax.lax.while_loop(cond, body, (a, zero, zero + n, zero + 2 * _lg2(n)))
    big = last - first > 3  # the depth limit was reached: heap selection (rare)
    stop = jnp.where(big, last, first)  # an empty heap pass unless taken
    a = _heap(a, first, jnp.where(big, nth + 1, first), stop, first)
    a = jax.tree.map(lambda x, y: jnp.where(big, x, y), _exchange(a, first, nth), a)
    small = jnp.where(big, first, last)
    return _stable_sort_range(a, first, small)


def _sort(a, first: int, last: int):
    """std::sort on [first, last): introsort partitions down to ranges of 16, then one
    stable insertion sort. The recursion on right parts is a stack of pending ranges (the
    ranges are disjoint, so the order they are processed in does not change the result)."""
    if last - first > _SORT_THRESHOLD:
        depth0 = 2 * _lg2(last - first)
        zero = jnp.zeros((), jnp.int32)

        def body(s):
            a, stack, sp, lo, hi, depth = s
            big = hi - lo > _SORT_THRESHOLD
            part = big & (depth > 0)
            heap = big & (depth == 0)  # the depth limit: heapsort the range (rare)
            b, cut = _partition(a, lo, hi)
            a = jax.tree.map(lambda x, y: jnp.where(part, x, y), b, a)
            hlo, hhi = jnp.where(heap, lo, 0), jnp.where(heap, hi, 0)
            a = _heap(a, hlo, hhi, hhi, hhi)
            stack = jnp.where(part, stack.at[sp].set(jnp.stack([cut, hi, depth - 1])), stack)
            top = stack[jnp.maximum(sp - 1, 0)]
            more = sp > 0
            nlo = jnp.where(part, lo, jnp.where(more, top[0], 0))
            nhi = jnp.where(part, cut, jnp.where(more, top[1], 0))
            nd = jnp.where(part, depth - 1, top[2])
            nsp = jnp.where(part, sp + 1, jnp.maximum(sp - 1, 0))
            return a, stack, nsp, nlo, nhi, nd

        stack = jnp.zeros((depth0 + 2, 3), jnp.int32)
        init = (a, stack, zero, zero + first, zero + last, zero + depth0)
        a = jax.lax.while_loop(lambda s: (s[4] - s[3] > _SORT_THRESHOLD) | (s[2] > 0), body, init)[0]
    return _stable_sort_range(a, first, last)


def _row(key: jax.Array, k: int, sorted_: bool) -> jax.Array:
    n = key.shape[0]
    a = (key, jnp.arange(n, dtype=jnp.int32))
    zero = jnp.zeros((), jnp.int32)
    if k * 64 <= n:
        a = _heap(a, zero, zero + k, zero + n, zero + k)
    else:
        a = _nth_element(a, k - 1, n)
        if sorted_:
            a = _sort(a, 0, k - 1)
    return a[1][:k]


def topk_indices(key: jax.Array, k: int, sorted_: bool) -> jax.Array:
    """Indices torch's CPU topk returns for rows of ``key`` (last axis; larger key first)."""
    rows = key.reshape(-1, key.shape[-1])
    idx = jax.vmap(lambda r: _row(r, k, sorted_))(rows)
    return idx.reshape(key.shape[:-1] + (k,))


def needs_cpu_order(k: int, n: int, sorted_: bool) -> bool:
    """Whether the CPU order can differ from a sorted top-k even without ties (the
    ``sorted=False`` result of ``nth_element``, a few vector passes to replay)."""
    return not sorted_ and k * 64 > n and k > 1


# The partial-sort path (k * 64 <= n) replays heap operations one element at a time:
# beyond this row length ties resolve to the lowest index instead (a sequential loop over
# a vocabulary-sized row would cost more than the top-k itself).
MAX_HEAP_REPLAY = 4096


def replayable(k: int, n: int) -> bool:
    return k * 64 > n or n <= MAX_HEAP_REPLAY
