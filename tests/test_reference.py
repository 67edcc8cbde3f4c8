"""The NumPy reference against closed forms, against itself, and against finite differences."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as ref


def rand(rng, *shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def qkv(seed, lead, nq, nk, d, dtype=np.float64, mult=1.0):
    rng = np.random.default_rng(seed)
    return (rand(rng, *lead, nq, d, dtype=dtype) * mult, rand(rng, *lead, nk, d, dtype=dtype) * mult,
            rand(rng, *lead, nk, d, dtype=dtype))


def rel(a, b):
    return np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)


# --- softmax ---------------------------------------------------------------------------------

def test_softmax_closed_form():
    x = np.log(np.array([[1.0, 2.0, 5.0]]))
    expect = np.array([[0.125, 0.25, 0.625]])
    for f in (ref.naive_softmax, ref.safe_softmax, ref.online_softmax):
        np.testing.assert_allclose(f(x), expect, rtol=1e-15)
    np.testing.assert_allclose(ref.online_softmax(x, block_n=2), expect, rtol=1e-15)


@given(st.integers(1, 40), st.integers(1, 50), st.integers(0, 2**32 - 1),
       st.sampled_from([1.0, 1e3, 1e30]))
@settings(max_examples=40, deadline=None)
def test_softmax_forms_agree(n, block_n, seed, mult):
    x = np.random.default_rng(seed).standard_normal((3, n)) * mult
    expect = ref.safe_softmax(x)
    for got in (ref.online_softmax(x), ref.online_softmax(x, block_n=block_n)):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, expect, rtol=1e-12, atol=1e-300)
    m, l = ref.online_softmax_stats_blocked(x, block_n)
    np.testing.assert_allclose(m, x.max(axis=-1), rtol=0)
    np.testing.assert_allclose(l, np.exp(x - m[:, None]).sum(-1), rtol=1e-12)


def test_naive_overflows_where_safe_and_online_do_not():
    x = np.array([[1000.0, 999.0, 0.0]], dtype=np.float32)
    assert np.isnan(ref.naive_softmax(x)).any()
    for got in (ref.safe_softmax(x), ref.online_softmax(x), ref.online_softmax(x, block_n=2)):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got.sum(), 1.0, rtol=1e-6)
        assert got.dtype == np.float32


def test_fully_masked_softmax_row_is_zero():
    x = np.full((2, 4), -np.inf)
    for f in (ref.safe_softmax, ref.online_softmax):
        np.testing.assert_array_equal(f(x), 0.0)


# --- forward -----------------------------------------------------------------------------------

def test_attention_closed_form():
    # one key: out = v, lse = scale q.k
    q = np.array([[2.0, 0.0]])
    k = np.array([[1.5, 3.0]])
    v = np.array([[7.0, -1.0]])
    out, lse = ref.attention_forward(q, k, v, scale=0.5)
    np.testing.assert_allclose(out, v)
    np.testing.assert_allclose(lse, [1.5])
    # equal logits: out = mean of v, lse = log Nk
    k = np.zeros((4, 2))
    v = np.arange(8.0).reshape(4, 2)
    out, lse = ref.attention_forward(q, k, v)
    np.testing.assert_allclose(out, v.mean(0, keepdims=True))
    np.testing.assert_allclose(lse, [np.log(4)])


shapes = st.tuples(st.integers(1, 2), st.integers(1, 37), st.integers(1, 37), st.integers(1, 17))
blocks = st.tuples(st.integers(1, 40), st.integers(1, 40))


@given(shapes, blocks, st.booleans(), st.integers(0, 2**32 - 1), st.sampled_from(["kv", "q"]))
@settings(max_examples=60, deadline=None)
def test_flash_and_blocked_match_standard(shape, block, causal, seed, outer):
    b, nq, nk, d = shape
    q, k, v = qkv(seed, (b,), nq, nk, d)
    out, lse = ref.attention_forward(q, k, v, causal=causal)
    for got_out, got_lse in (
        ref.flash_forward(q, k, v, block_m=block[0], block_n=block[1], causal=causal, outer=outer),
        ref.blocked_attention(q, k, v, block_m=block[0], block_n=block[1], causal=causal),
    ):
        assert not np.isnan(got_out).any() and not np.isnan(got_lse).any()
        np.testing.assert_allclose(got_out, out, rtol=1e-12, atol=1e-12 * np.abs(out).max())
        np.testing.assert_array_equal(np.isneginf(got_lse), np.isneginf(lse))
        fin = np.isfinite(lse)
        np.testing.assert_allclose(got_lse[fin], lse[fin], rtol=1e-12, atol=1e-12)


def test_fully_masked_rows_forward_and_backward():
    # Nq > Nk under causal: the first Nq - Nk query rows see no key
    q, k, v = qkv(0, (2,), 7, 3, 4)
    dout = rand(np.random.default_rng(1), 2, 7, 4)
    for out, lse in (ref.attention_forward(q, k, v, causal=True),
                     ref.flash_forward(q, k, v, block_m=2, block_n=2, causal=True),
                     ref.flash_forward(q, k, v, block_m=2, block_n=2, causal=True, outer="q")):
        np.testing.assert_array_equal(out[:, :4], 0.0)
        assert np.all(np.isneginf(lse[:, :4])) and np.all(np.isfinite(lse[:, 4:]))
        for grads in (ref.attention_backward(dout, q, k, v, causal=True),
                      ref.flash_backward(dout, q, k, v, out, lse, block_m=3, block_n=2, causal=True)):
            assert all(np.isfinite(g).all() for g in grads)
            np.testing.assert_array_equal(grads[0][:, :4], 0.0)


@pytest.mark.parametrize("nq,nk,d,bm,bn", [(1, 1, 1, 1, 1), (1, 5, 3, 4, 2), (5, 1, 2, 1, 8),
                                            (9, 9, 1, 64, 64), (13, 11, 6, 4, 3)])
def test_edge_shapes(nq, nk, d, bm, bn):
    q, k, v = qkv(3, (), nq, nk, d)
    for causal in (False, True):
        out, lse = ref.attention_forward(q, k, v, causal=causal)
        got, got_lse = ref.flash_forward(q, k, v, block_m=bm, block_n=bn, causal=causal)
        np.testing.assert_allclose(got, out, rtol=1e-12, atol=1e-14)
        assert got.shape == (nq, d) and got_lse.shape == (nq,)


@pytest.mark.parametrize("dtype,mult", [(np.float32, 1e3), (np.float64, 1e3), (np.float64, 1e150)])
def test_extreme_logits_stay_finite(dtype, mult):
    q, k, v = qkv(5, (2,), 19, 23, 8, dtype=dtype, mult=mult)
    with np.errstate(over="ignore"):
        for causal in (False, True):
            out, lse = ref.flash_forward(q, k, v, block_m=4, block_n=5, causal=causal)
            std, std_lse = ref.attention_forward(q, k, v, causal=causal)
            assert out.dtype == dtype and np.isfinite(out).all() and np.isfinite(lse).all()
            np.testing.assert_allclose(out, std, rtol=1e-3 if dtype == np.float32 else 1e-9,
                                       atol=1e-3 * np.abs(v).max())
            dout = np.ones_like(out)
            assert all(np.isfinite(g).all() for g in
                       ref.flash_backward(dout, q, k, v, out, lse, block_m=4, block_n=5, causal=causal))


def test_keeps_float32():
    q, k, v = qkv(0, (), 5, 6, 3, dtype=np.float32)
    out, lse = ref.flash_forward(q, k, v, block_m=2, block_n=2)
    assert out.dtype == lse.dtype == np.float32
    assert all(g.dtype == np.float32 for g in ref.attention_backward(out, q, k, v))


# --- backward ----------------------------------------------------------------------------------

def _loss(q, k, v, w, causal):
    return (ref.attention_forward(q, k, v, causal=causal)[0] * w).sum()


@pytest.mark.parametrize("causal", [False, True])
def test_backward_matches_finite_differences(causal):
    q, k, v = qkv(11, (2,), 5, 7, 3)
    w = rand(np.random.default_rng(12), 2, 5, 3)  # dL/dout
    grads = ref.attention_backward(w, q, k, v, causal=causal)
    eps = 1e-6
    for x, g in zip((q, k, v), grads):
        fd = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            old = x[idx]
            x[idx] = old + eps
            up = _loss(q, k, v, w, causal)
            x[idx] = old - eps
            down = _loss(q, k, v, w, causal)
            x[idx] = old
            fd[idx] = (up - down) / (2 * eps)
        np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


@given(shapes, blocks, st.booleans(), st.integers(0, 2**32 - 1))
@settings(max_examples=40, deadline=None)
def test_flash_backward_matches_standard(shape, block, causal, seed):
    b, nq, nk, d = shape
    q, k, v = qkv(seed, (b,), nq, nk, d)
    dout = rand(np.random.default_rng(seed + 1), b, nq, d)
    out, lse = ref.attention_forward(q, k, v, causal=causal)
    expect = ref.attention_backward(dout, q, k, v, causal=causal)
    got = ref.flash_backward(dout, q, k, v, out, lse, block_m=block[0], block_n=block[1], causal=causal)
    for g, e in zip(got, expect):
        assert rel(g, e) <= 1e-12 or np.abs(g - e).max() < 1e-13


def test_gqa_helpers_roundtrip():
    x = rand(np.random.default_rng(0), 2, 2, 3, 4)
    rep = ref.repeat_kv(x, 6)
    assert rep.shape == (2, 6, 3, 4)
    np.testing.assert_allclose(ref.sum_kv_groups(rep, 2), 3 * x)


def test_bad_input_is_rejected():
    q, k, v = qkv(0, (), 3, 3, 2)
    with pytest.raises(ValueError, match="head dims"):
        ref.attention_forward(q, k[:, :1], v)
    with pytest.raises(TypeError, match="dtypes differ"):
        ref.attention_forward(q, k.astype(np.float32), v)
    with pytest.raises(ValueError, match="scale"):
        ref.attention_forward(q, k, v, scale=float("nan"))
    with pytest.raises(ValueError, match="block_m"):
        ref.flash_forward(q, k, v, block_m=0, block_n=1)


# --- costs -------------------------------------------------------------------------------------

def test_memory_and_flops():
    mem = ref.attention_memory(4096, 64, np.float32)
    assert mem["Q"] == 1 << 20 and mem["S"] == mem["P"] == 64 << 20
    assert ref.forward_flops(8, 8, 2) == 4 * 64 * 2
    assert ref.visible_pairs(4, 4, causal=True) == 10
    assert ref.visible_pairs(5, 3, causal=True) == 0 + 0 + 1 + 2 + 3
    assert ref.backward_flops(8, 8, 2) == 2.5 * ref.forward_flops(8, 8, 2)
    assert ref.hbm_accesses_flash(4096, 64, 25600) < ref.hbm_accesses_standard(4096, 64)
    assert ref.hbm_crossover(64, 25600) is None          # M > 2 d^2: flash always moves less
    n = ref.hbm_crossover(128, 1000)                       # M < 2 d^2: it stops paying
    assert n is not None and ref.hbm_accesses_flash(n, 128, 1000) > ref.hbm_accesses_standard(n, 128)
    assert abs(ref.recompute_flop_ratio()["flash"] - 7 / 6) < 1e-15


@pytest.mark.parametrize("regime", ["normal", "positive", "dominant"])
def test_3xtf32_products_keep_float32_accuracy(regime):
    # error in units of roundoff of sum |a b|: 3xTF32 within a few, like NumPy's float32
    # matmul; one plain TF32 product (inputs rounded once) a thousand times that
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((16, 128)), rng.standard_normal((128, 8))
    if regime == "positive":
        a, b = np.abs(a), np.abs(b)
    if regime == "dominant":
        a[:, 3], b[3, :] = 1e3, 1.0
    a, b = a.astype(np.float32), b.astype(np.float32)
    truth = a.astype(np.float64) @ b
    units = (np.abs(a.astype(np.float64)) @ np.abs(b)) * 2.0 ** -24

    def err(c):
        return (np.abs(c - truth) / units).max()
    assert err(ref.matmul_3xtf32(a, b)) < 5
    assert err(ref.round_tf32(a).astype(np.float64) @ ref.round_tf32(b)) > 100
    big, small = ref.split_tf32(a)
    assert np.all(np.abs(big.astype(np.float64) + small - a) <= np.abs(a) * 2.0 ** -22)


def test_fma_order_product_is_the_kernels_sum():
    # one rounding per term in ascending order: equal to a float32 loop with exact products
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((3, 9)).astype(np.float32), rng.standard_normal((9, 2)).astype(np.float32)
    loop = np.zeros((3, 2), np.float32)
    for i in range(3):
        for j in range(2):
            acc = np.float32(0)
            for c in range(9):
                acc = np.float32(np.float64(acc) + np.float64(a[i, c]) * np.float64(b[c, j]))
            loop[i, j] = acc
    np.testing.assert_array_equal(ref.matmul_fma_order(a, b), loop)
