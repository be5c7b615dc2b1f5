"""Where a token sits: added to the input once (sinusoidal, learned), or inside every head (rope, alibi).

    sinusoidal  PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...), added to the embeddings
                                                                                (Vaswani et al. 2017)
    learned     a learned vector per position, added to the embeddings
    rope        each head's query and key rotated pairwise: (x_2i, x_2i+1) by the angle pos * base^(-2i/d_k), so
                that q_i . k_j depends on i - j only (Su et al. 2021, RoFormer)
    alibi       no position vector; each head's logits get -m_h |i - j|, a fixed geometric slope m_h per head
                (Press et al. 2022; |i - j|: both directions, as an encoder reads)

Positions count from 0 over the attention's positions (a cls readout's vector is position 0).
Shapes: n positions, d width, H heads, d_k per-head query/key size.
"""

import math

import torch


def sinusoidal(n: int, d: int) -> torch.Tensor:
    """The sinusoidal table: (n, d)."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]  # (n, 1)
    freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))  # (ceil(d/2),)
    pe = torch.zeros(n, d)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq[: d // 2])
    return pe


def rotate(x: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary position: x (..., n, d_k), d_k even, each pair (x_2i, x_2i+1) at position p rotated by p theta_i,
    theta_i = base^(-2i/d_k) -> (..., n, d_k)."""
    n, d = x.shape[-2], x.shape[-1]
    exact = torch.float64 if x.dtype == torch.float64 else torch.float32  # angles at least in float32
    theta = base ** (-torch.arange(0, d, 2, dtype=exact, device=x.device) / d)  # (d_k / 2,)
    angle = torch.arange(n, dtype=exact, device=x.device)[:, None] * theta  # (n, d_k / 2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    even, odd = x.unflatten(-1, (-1, 2)).unbind(-1)  # (..., n, d_k / 2) each
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's slopes, (H,): 2^(-8h/H) for h = 1..H when H is a power of 2; otherwise those of the power of 2
    below H, then every other slope of twice that power for the rest (Press et al.'s code)."""

    def powers(h: int) -> list[float]:
        return [2 ** (-8 * (i + 1) / h) for i in range(h)]

    below = 2 ** math.floor(math.log2(n_heads))
    slopes = powers(below) + powers(2 * below)[0::2][: n_heads - below]
    return torch.tensor(slopes)


def alibi_bias(slopes: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """-m_h |i - j| for every head, query i < n and key j < m: (H, n, m)."""
    i = torch.arange(n, device=slopes.device)[:, None]
    j = torch.arange(m, device=slopes.device)[None, :]
    return -slopes[:, None, None] * (i - j).abs().to(slopes.dtype)  # (H, n, m)
