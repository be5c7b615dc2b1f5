"""Multi-head attention whose head split and head design are fully configurable.

Notation (used in every shape comment): B batch, n sequence length, H query heads,
G key/value heads (H % G == 0; G = H is ordinary multi-head attention, G = 1 multi-query),
d_k per-head query/key size, d_v per-head value size, c attention maps per head (2 differential, else 1).

forward() is the definition, one stage after another:
    projections   q, k, v from x; keys and values from a shared latent of rank r (latent_kv); QK-norm (qk_norm);
                  later layers' values mixed with the first layer's (value_residual); q and k rotated (rope)
    score         a scoring function (headlab.model.scoring: dot, additive, or a package's) gives the logits,
                  plus each head's distance penalty (alibi)
    logit mixing  talking heads before the normaliser (talking_heads: pre, both); multi-token attention's
                  convolution of each head's logits over queries and keys (mta)
    normaliser    softmax, sigmoid, softmax1, sink, softpick, ssmax (headlab.model.normalizers), padded keys exactly 0
    differential  two maps a head, the second subtracted with weight lambda (differential)
    weight mixing talking heads after the normaliser (talking_heads: post, both); mta's mixing within groups of
                  heads
    values        weights @ v, then a head's own normalisation (differential; mta's group norm)
    output gate   none, headwise, elementwise (headlab.model.gates); mixture of heads' routing weights (moh)
    merge         head mask, concatenation, output projection
Where a stage has a faster equivalent path (fused SDPA, fused additive attention), it takes it. Each stage's
tensors pass a hook point (headlab.model.hooks) named as TransformerLens names them.
"""

import math

import torch
from torch import nn

from headlab.errors import InvalidSetting
from headlab.model import positions, rules
from headlab.model.dropout import dropout
from headlab.model.hooks import HookPoint


class MultiHeadAttention(nn.Module):
    """Self-attention with H heads of query/key size d_k and value size d_v, scored by the scoring function named.

    forward(x, key_padding_mask, need_weights, head_mask, pass_state) -> (out, weights):
      x (B, n, d_model); key_padding_mask (B, n) bool, True = padding;
      head_mask (H,) or (B, H), a multiplier on each head's output (Michel et al. 2019), or (K B, H): K copies of
      the batch part at the heads' outputs (copied), each under its own rows (out then (K B, n, d_model));
      pass_state, a dict shared by the layers of one forward pass: the first layer leaves its values there, and a
      later layer with value_residual mixes them into its own; a training layer with moh.balance adds its weighted
      load-balance loss to its "balance";
      out (B, n, d_model); weights (B, H, n, n) after the normaliser (and mixing), exactly 0 on padded keys, or
      None. Rows sum to 1 with softmax only; a differential head's weights are signed.
    Without weights asked for, fused paths that never store the (B, H, n, n) weights may run (dispatch).
    The designs (docs/heads.md): gate, talking_heads, differential, normalizer, qk_norm, latent_kv, value_residual,
    mta, moh;
    position inside the heads: rope (rope_base) or alibi (headlab.model.positions; the encoder's `positional`).
    `layer`, the block's index from 0, sets a differential head's lambda_init and whether values are mixed.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int = 4,
        d_k: int | None = None,
        d_v: int | None = None,
        n_kv_heads: int | None = None,
        scoring: str = "dot",
        scale: bool = True,
        dropout: float = 0.0,
        gate: str = "none",
        talking_heads: str = "none",
        differential: bool = False,
        normalizer: str = "softmax",
        qk_norm: bool = False,
        latent_kv: int | None = None,
        value_residual: bool = False,
        mta: dict | None = None,
        moh: dict | None = None,
        position: str = "none",
        rope_base: float = 10000.0,
        layer: int = 0,
    ):
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise InvalidSetting("dropout", dropout, "a number in [0, 1)")
        sizes = rules.head_sizes(d_model, n_heads, d_k, d_v, n_kv_heads, differential=differential)
        self.d_k, self.d_v, self.n_kv_heads = sizes
        rules.designs(differential, talking_heads, normalizer, gate, latent_kv)
        rules.position_in_heads(position, scoring, self.d_k)
        rules.multi_token(mta, n_heads, differential, talking_heads)
        rules.mixture_of_heads(moh, n_heads)
        self.d_model, self.n_heads, self.scoring, self.dropout = d_model, n_heads, scoring, dropout
        self.normalizer, self.gate, self.talking_heads = normalizer, gate, talking_heads
        self.maps = 2 if differential else 1
        self.scale = 1.0 / math.sqrt(self.d_k) if scale else 1.0
        G, qk = self.n_kv_heads, self.maps * self.d_k  # key/value heads, query/key width of a head
        self.q_proj = nn.Linear(d_model, n_heads * qk)
        self.kv_down = None if latent_kv is None else nn.Linear(d_model, latent_kv, bias=False)  # W_down: x -> c
        self.k_proj = nn.Linear(latent_kv or d_model, G * qk)
        self.v_proj = nn.Linear(latent_kv or d_model, G * self.d_v)
        self.out_proj = nn.Linear(n_heads * self.d_v, d_model)
        self.q_norm = nn.LayerNorm(self.d_k) if qk_norm else None
        self.k_norm = nn.LayerNorm(self.d_k) if qk_norm else None
        # talking heads: (H, H) matrices, row h to column h', starting as the identity (independent heads)
        self.logit_mix, self.weight_mix = (
            nn.Parameter(torch.eye(n_heads)) if talking_heads in (where, "both") else None for where in ("pre", "post")
        )
        if differential:
            self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer)
            for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):  # (d_k,) each, as in the paper's code
                setattr(self, name, nn.Parameter(torch.randn(self.d_k) * 0.1))
            self.head_norm = nn.RMSNorm(self.d_v, eps=1e-5)
        self.differential = differential
        # value residual (Zhou et al. 2024): v_l <- lambda_1 v_l + lambda_2 v_1 in layers after the first, from 0.5 each
        self.value_mix = nn.Parameter(torch.full((2,), 0.5)) if value_residual and layer > 0 else None
        self.position, self.rope_base = position, rope_base
        self.moh_k = moh["k"] if moh else None
        self.moh_balance = moh.get("balance", 0.0) if moh else 0.0  # its loss's weight beta (absent: none)
        if moh:  # mixture of heads (Jin et al. 2024): routers W_s (shared heads), W_r (routed heads), W_h (their split)
            shared = moh["shared"]
            self.route_shared = nn.Linear(d_model, shared, bias=False) if shared > 1 else None  # one: softmax 1
            self.route_routed = nn.Linear(d_model, n_heads - shared, bias=False)
            self.route_split = nn.Linear(d_model, 2, bias=False)
        self.mta_kernel = self.mta_mix = None
        if mta:  # multi-token attention (Golovneva et al. 2025), both parts starting as the identity (plain heads)
            cq, ck, g = mta["query_kernel"], mta["key_kernel"], mta["head_group"]
            kernel = torch.zeros(n_heads, 1, cq, ck)  # a (c_q, c_k) kernel a head, its centre 1
            kernel[:, :, cq // 2, ck // 2] = 1.0
            self.mta_kernel = nn.Parameter(kernel)
            self.mta_mix = nn.Parameter(torch.eye(g).repeat(n_heads // g, 1, 1))  # (H / g, g, g): head s to head t
        self.mta_norm = self.mta_gate = None
        if mta and mta.get("group_norm"):  # each head's output RMS-normalised (one weight for all heads), then
            self.mta_norm = nn.RMSNorm(self.d_v, eps=1e-5)  # gated by a scalar of its own: the paper's group norm
            self.mta_gate = nn.Linear(self.d_v, 1)  # with scalar gating (the authors' code: gate_1d)
        if position == "alibi":
            self.register_buffer("alibi_slopes", positions.alibi_slopes(n_heads), persistent=False)  # (H,)
        self.scoring_fn = rules.load_stage("scoring", scoring)  # a class of headlab.model.scoring (or a package's)
        self.normalizer_fn = rules.load_stage("normalizer", normalizer)
        self.gate_fn = rules.load_stage("gate", gate)
        for stage in (self.scoring_fn, self.normalizer_fn, self.gate_fn):
            stage.add_parameters(self)
        for point in ("q", "k", "v", "rot_q", "rot_k", "attn_scores", "pattern", "z", "gate", "route", "result"):
            setattr(self, f"hook_{point}", HookPoint())
        # maps that the fused paths compute: no mixing, one map a head, no bias beside the padding mask
        self.fusable = talking_heads == "none" and not differential and position != "alibi" and not mta

    def forward(
        self,
        x: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        head_mask: torch.Tensor | None = None,
        pass_state: dict | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        q, k, v = self.project(x, pass_state)  # (B, H c, n, d_k), (B, G c, n, d_k), (B, G, n, d_v)
        p_drop = self.dropout if self.training else 0.0
        explicit = need_weights or not self.fusable or self.hook_attn_scores.hooked or self.hook_pattern.hooked
        if not explicit and (y := self.normalizer_fn.fused(self, q, k, v, key_padding_mask, p_drop)) is not None:
            return self.merge(self.hook_z(self.gated(y, x, key_padding_mask, pass_state)), head_mask), None

        H, G = self.n_heads, self.n_kv_heads
        if G < H:  # each key/value head serves H / G consecutive query heads (its c maps their c maps)
            k = k.unflatten(1, (G, self.maps)).repeat_interleave(H // G, dim=1).flatten(1, 2)  # (B, H c, n, d_k)
            v = v.repeat_interleave(H // G, dim=1)  # (B, H, n, d_v)
        weights = self.hook_pattern(self.attend(q, k, key_padding_mask))  # (B, H, n, n)
        y = self.normed(dropout(weights, p_drop) @ v)  # (B, H, n, d_v)
        y = self.hook_z(self.gated(y, x, key_padding_mask, pass_state))
        return self.merge(y, head_mask), (weights if need_weights else None)

    def project(
        self, x: torch.Tensor, pass_state: dict | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of every head: x (B, n, d_model) -> (B, H c, n, d_k), (B, G c, n, d_k),
        (B, G, n, d_v); a head's c maps are consecutive. hook_q, hook_k, hook_v see them before rotation and
        mixing, hook_rot_q and hook_rot_k after rotation (TransformerLens's names)."""
        B, n, _ = x.shape
        H, G, c = self.n_heads, self.n_kv_heads, self.maps
        latent = x if self.kv_down is None else self.kv_down(x)  # (B, n, r): c = W_down x
        q = self.q_proj(x).view(B, n, H * c, self.d_k).transpose(1, 2)  # (B, H c, n, d_k)
        k = self.k_proj(latent).view(B, n, G * c, self.d_k).transpose(1, 2)  # (B, G c, n, d_k)
        v = self.v_proj(latent).view(B, n, G, self.d_v).transpose(1, 2)  # (B, G, n, d_v)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        if pass_state is not None:
            v = self.mix_values(v, pass_state)
        if self.position == "rope":
            q, k = (
                self.hook_rot_q(positions.rotate(q, self.rope_base)),
                self.hook_rot_k(positions.rotate(k, self.rope_base)),
            )
        return q, k, v

    def mix_values(self, v: torch.Tensor, pass_state: dict) -> torch.Tensor:
        """The first layer's values, kept; a later layer's mixed with them when it has value_mix:
        v (B, G, n, d_v) -> lambda_1 v + lambda_2 v_first (B, G, n, d_v)."""
        first = pass_state.setdefault("first", v)
        if self.value_mix is None:
            return v
        return self.value_mix[0] * v + self.value_mix[1] * first

    def attend(self, q: torch.Tensor, k: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
        """Score, mix logits, normalise, subtract a differential head's second map, mix weights:
        q, k (B, H c, n, d_k) -> weights (B, H, n, m)."""
        if self.differential:  # (softmax(q1 k1^T s) - lambda softmax(q2 k2^T s)) for each head (Ye et al. 2024)
            (q1, q2), (k1, k2) = q.unflatten(1, (-1, 2)).unbind(2), k.unflatten(1, (-1, 2)).unbind(2)  # (B, H, n, d_k)
            scores = self.hook_attn_scores(
                torch.stack([self.score(q1, k1), self.score(q2, k2)], dim=2)
            )  # (B, H, 2, n, m)
            first, second = (self.normalizer_fn.weights(self, s, key_padding_mask) for s in scores.unbind(2))
            return first - self.lambda_full() * second
        scores = self.score(q, k)  # (B, H, n, m)
        if self.logit_mix is not None:
            scores = torch.einsum("bhnm,hg->bgnm", scores, self.logit_mix)
        if self.mta_kernel is not None:
            scores = self.convolved(scores, key_padding_mask)
        weights = self.normalizer_fn.weights(self, self.hook_attn_scores(scores), key_padding_mask)  # (B, H, n, m)
        if self.weight_mix is not None:
            weights = torch.einsum("bhnm,hg->bgnm", weights, self.weight_mix)
        if self.mta_mix is not None:  # within each group of g heads: W_t <- sum_s M[s, t] W_s
            B, H, n, m = weights.shape
            grouped = weights.view(B, H // self.mta_mix.shape[-1], -1, n, m)  # (B, H / g, g, n, m)
            weights = torch.einsum("bgsnm,gst->bgtnm", grouped, self.mta_mix).reshape(B, H, n, m)
        return weights

    def convolved(self, scores: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
        """Multi-token attention's key-query convolution: each head's logits, those of padded queries and keys set
        to 0 first, convolved with the head's own (c_q, c_k) kernel centred on (i, j): (B, H, n, m) -> (B, H, n, m).
        Self-attention: queries and keys are the same positions (n = m), padded alike."""
        if key_padding_mask is not None:
            padded = key_padding_mask[:, None, :, None] | key_padding_mask[:, None, None, :]  # (B, 1, n, m)
            scores = scores.masked_fill(padded, 0.0)
        cq, ck = self.mta_kernel.shape[-2:]
        kernel = self.mta_kernel
        if scores.device.type == "cpu":  # channels-last for the CPU's depthwise kernel: the numbers to rounding, a
            # training step's convolution 2-3x faster (BENCHMARKS.md's mta rows; a GPU's unmeasured: left as it is)
            scores, kernel = _channels_last(scores), _channels_last(kernel)
        convolved = nn.functional.conv2d(scores, kernel, padding=(cq // 2, ck // 2), groups=self.n_heads)
        return convolved.contiguous()  # (B, H, n, m) in the usual layout

    def score(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """The logits: the scoring function's, plus ALiBi's -m_h |i - j|: q (B, H, n, d_k), k (B, H, m, d_k) ->
        (B, H, n, m)."""
        scores = self.scoring_fn.scores(self, q, k)
        if self.position == "alibi":
            scores = scores + positions.alibi_bias(self.alibi_slopes, q.shape[-2], k.shape[-2]).to(scores.dtype)
        return scores

    def dot_product_points(self) -> tuple[str, str] | None:
        """The hook points whose queries and keys give every logit as one scaled dot product (q . k) scale, after
        rotation with rope; None where a logit is more (additive scoring, two maps a head, logits mixed across
        heads, a distance bias)."""
        if not self.scoring_fn.dot_product or self.maps != 1 or self.logit_mix is not None or self.position == "alibi":
            return None
        return ("hook_rot_q", "hook_rot_k") if self.position == "rope" else ("hook_q", "hook_k")

    def lambda_full(self) -> torch.Tensor:
        """A differential layer's lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init."""
        first, second = (self.lambda_q1 * self.lambda_k1).sum(), (self.lambda_q2 * self.lambda_k2).sum()
        return torch.exp(first) - torch.exp(second) + self.lambda_init

    def normed(self, y: torch.Tensor) -> torch.Tensor:
        """Each head's own normalisation of its output: a differential head's RMSNorm times 1 - lambda_init;
        multi-token attention's group norm, y' = RMSNorm(y) sigmoid(w . RMSNorm(y) + b); else y as it is:
        (B, H, n, d_v) -> (B, H, n, d_v)."""
        if self.differential:
            return self.head_norm(y) * (1 - self.lambda_init)
        if self.mta_norm is not None:
            y = self.mta_norm(y)
            return y * torch.sigmoid(self.mta_gate(y))  # (B, H, n, d_v) * (B, H, n, 1)
        return y

    def gated(
        self, y: torch.Tensor, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, pass_state=None
    ) -> torch.Tensor:
        """The output gate and the mixture of heads' routing weights on each head's output: y (B, H, n, d_v),
        x (B, n, d_model) -> (B, H, n, d_v)."""
        gate = self.gate_fn.values(self, x)
        y = y if gate is None else y * self.hook_gate(gate)
        return y if self.moh_k is None else y * self.hook_route(self.routes(x, key_padding_mask, pass_state))

    def routes(self, x: torch.Tensor, key_padding_mask=None, pass_state: dict | None = None) -> torch.Tensor:
        """Mixture of heads' weight g_h of every head at every position: x (B, n, d_model) -> (B, H, n, 1);
        g = alpha_1 softmax(W_s x) on the shared heads, alpha_2 softmax(W_r x) on the k routed heads of largest
        W_r x and 0 on the other routed heads, [alpha_1, alpha_2] = softmax(W_h x). Training with moh.balance, it
        adds beta L_b (load_balance) to pass_state's "balance"."""
        alpha = torch.softmax(self.route_split(x), dim=-1)  # (B, n, 2)
        shared = alpha[..., :1]  # (B, n, h_s)
        if self.route_shared is not None:
            shared = shared * torch.softmax(self.route_shared(x), dim=-1)
        routed = torch.softmax(self.route_routed(x), dim=-1)  # (B, n, H - h_s)
        chosen = torch.zeros_like(routed).scatter(-1, routed.topk(self.moh_k, dim=-1).indices, 1.0)
        if self.moh_balance and self.training and pass_state is not None:
            loss = self.moh_balance * load_balance(routed, chosen, key_padding_mask)
            pass_state["balance"] = pass_state["balance"] + loss if "balance" in pass_state else loss
        return torch.cat([shared, alpha[..., 1:] * routed * chosen], dim=-1).transpose(1, 2).unsqueeze(-1)

    def merge(self, y: torch.Tensor, head_mask: torch.Tensor | None) -> torch.Tensor:
        """Mask heads, concatenate them and project: y (B, H, n, d_v) -> (B, n, d_model). With a hook on
        hook_result, each head's own contribution (B, n, H, d_model) passes it first, and their sum is the output."""
        if head_mask is not None:
            y = copied(y, head_mask.shape[0]) if head_mask.dim() == 2 else y  # (K B, H, n, d_v) for a (K B, H) mask
            y = y * head_mask.reshape(-1, y.shape[1], 1, 1).to(y.dtype)  # (H,), (B, H) or (K B, H): over n, d_v
        B, H, n, _ = y.shape
        if self.hook_result.hooked:
            W = self.out_proj.weight.view(self.d_model, H, self.d_v)  # (d_model, H, d_v): W_O by head
            result = self.hook_result(torch.einsum("bhnv,dhv->bnhd", y, W))  # (B, n, H, d_model)
            return result.sum(2) + self.out_proj.bias
        return self.out_proj(y.transpose(1, 2).reshape(B, n, H * self.d_v))  # (B, n, d_model)


def copied(t: torch.Tensor, rows: int) -> torch.Tensor:
    """t (B, ...) -> (rows, ...): rows / B copies of the batch, one after another (t itself where rows = B)."""
    return t if t.shape[0] == rows else t.repeat(rows // t.shape[0], *[1] * (t.dim() - 1))


def load_balance(routed: torch.Tensor, chosen: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
    """Mixture of heads' load-balance loss over its routed heads (Jin et al. 2024): L_b = sum_i f_i P_i, f_i
    the share of real positions that choose head i, P_i its mean routing probability softmax(W_r x)_i;
    routed, chosen (B, n, R) (chosen 1 where a position chooses the head), key_padding_mask (B, n) -> ()."""
    real = torch.ones_like(routed[..., :1]) if key_padding_mask is None else (~key_padding_mask)[..., None]
    real = real.to(routed.dtype)  # (B, n, 1)
    positions = real.sum()
    share, probability = (chosen * real).sum((0, 1)) / positions, (routed * real).sum((0, 1)) / positions  # (R,)
    return (share * probability).sum()


def _channels_last(t: torch.Tensor) -> torch.Tensor:
    """t (N, C, h, w) with its channels stored last (torch.channels_last's strides, also inside vmap)."""
    return t.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
