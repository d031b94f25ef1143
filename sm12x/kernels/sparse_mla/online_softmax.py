"""The online-softmax step every sparse MLA kernel takes per tile of candidates (base 2).

With ``s`` the tile's raw logits [BLOCK_H, BLOCK_N] (fp32), ``valid`` which candidates count, and
the running row maximum ``m_i`` and denominator ``l_i`` [BLOCK_H]:

    s' = where(valid, s * qk_scale, -inf)        (qk_scale carries log2(e))
    m_new = max(m_i, max_j s'),  alpha = 2^(m_i - m_new),  p = 2^(s' - m_new)
    l_new = l_i * alpha + sum_j p

-> (p, alpha, m_new, l_new); the caller rescales its accumulator by ``alpha`` and adds ``p @ V``
in whatever precision its MMA takes. A row whose tiles so far hold no valid candidate keeps
m_new = -inf: its exponents are taken against 0 so that (-inf) - (-inf) never appears.
"""
import triton
import triton.language as tl


@triton.jit
def online_softmax_step(s, valid, qk_scale, m_i, l_i):
    s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # avoids (-inf) - (-inf) on empty tiles
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_i
