"""A Transformer encoder (Vaswani et al. 2017) built on headlab's MultiHeadAttention.

tokens -> embedding (+ positions) -> n_layers x [attention, feed-forward] -> readout -> classifier.
Positions are added to the embeddings (sinusoidal, learned) or live inside each head (rope, alibi:
headlab.model.positions).
Shapes: B batch, n sequence length, c tokens summed per position, d d_model, L layers, H heads.
"""

import torch
from torch import nn

from headlab.conventions import PAD_ID
from headlab.model import positions, rules
from headlab.model.attention import MultiHeadAttention, copied
from headlab.model.dropout import Dropout  # headlab's dropout: a cheap CPU mask, F.dropout elsewhere


class Block(nn.Module):
    """Attention and a ReLU feed-forward, each with a residual; LayerNorm after ('post') or before ('pre')."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, norm: str, attention: dict, layer: int = 0):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, **attention, layer=layer)  # attention: its keys and position
        self.ff = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), Dropout(dropout), nn.Linear(d_ff, d_model))
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.drop = Dropout(dropout)
        self.pre_norm = norm == "pre"

    def forward(self, x, key_padding_mask=None, need_weights=False, head_mask=None, pass_state=None):
        # x (B, n, d) -> (B, n, d), or (K B, n, d) for a head_mask of K B rows (copies part here: a's rows);
        # weights (B, H, n, n) or None; pass_state: MultiHeadAttention's
        if self.pre_norm:
            a, w = self.attn(self.norm1(x), key_padding_mask, need_weights, head_mask, pass_state)
            x = copied(x, a.shape[0]) + self.drop(a)
            return x + self.drop(self.ff(self.norm2(x))), w
        a, w = self.attn(x, key_padding_mask, need_weights, head_mask, pass_state)
        x = self.norm1(copied(x, a.shape[0]) + self.drop(a))
        return self.norm2(x + self.drop(self.ff(x))), w


class Encoder(nn.Module):
    """Token classifier ('token' readout) or sequence classifier ('cls', 'mean' or 'max' readout).

    forward(tokens, key_padding_mask, need_weights, head_mask, need_balance, copies, copied_at)
      -> (logits, weights[, balance]):
      tokens (B, n) ids, or (B, n, c) when a position holds c tokens whose embeddings are summed (id 0 adds nothing);
      key_padding_mask (B, n) bool, True = padding; head_mask (L, H) or (B, L, H), or (copies B, L, H): copy k of
      the batch at rows k B to (k + 1) B, each under its own masks, computed once up to layer copied_at's heads'
      outputs (the layers before it must keep every head: their masks are not applied), the copies from there on
      (logits then (copies B, ...)): what the batch repeated `copies` times gives, for less;
      logits (B, n_classes) or (B, n, n_classes) for 'token'; weights: per layer (B, H, n', n') or None,
      where n' = n + 1 with the 'cls' readout (its learned vector sits at position 0);
      balance (), with need_balance: the layers' load-balance losses, weighted, that training adds to its
      objective (mixture of heads' moh.balance; 0 without).
    """

    def __init__(
        self,
        vocab_size: int,
        n_classes: int,
        max_len: int,
        readout: str,
        d_model: int = 64,
        n_layers: int = 1,
        d_ff: int | None = None,
        dropout: float = 0.0,
        attention: dict | None = None,
        norm: str = "post",
        positional: str = "sinusoidal",
        rope_base: float = 10000.0,
    ):
        super().__init__()
        self.design = {  # what it computes, as built: a checkpoint records it (plain types only)
            "vocab_size": vocab_size, "n_classes": n_classes, "max_len": max_len, "readout": readout,
            "d_model": d_model, "n_layers": n_layers, "d_ff": d_ff, "dropout": dropout,
            "attention": dict(attention or {}), "norm": norm, "positional": positional, "rope_base": rope_base,
        }  # fmt: skip
        rules.one_of("readout", readout, rules.READOUTS)
        rules.one_of("norm", norm, rules.NORMS)
        rules.one_of("positional", positional, rules.POSITIONALS)
        self.readout, self.n_layers = readout, n_layers
        n_pos = max_len + (readout == "cls")
        self.tok_emb = nn.Embedding(vocab_size, d_model, padding_idx=PAD_ID)
        if positional == "learned":
            self.pos_emb = nn.Parameter(torch.randn(n_pos, d_model) * 0.02)
        elif positional == "sinusoidal":
            self.register_buffer("pos_emb", positions.sinusoidal(n_pos, d_model), persistent=False)
        else:  # inside the heads
            self.pos_emb = None
        self.cls = nn.Parameter(torch.randn(1, 1, d_model) * 0.02) if readout == "cls" else None
        self.drop = Dropout(dropout)
        attention = dict(attention or {})  # MultiHeadAttention's own defaults
        if positional in rules.IN_HEADS:
            attention |= {"position": positional, "rope_base": rope_base}
        self.blocks = nn.ModuleList(
            Block(d_model, d_ff or 4 * d_model, dropout, norm, attention, layer) for layer in range(n_layers)
        )
        self.final_norm = nn.LayerNorm(d_model) if norm == "pre" else nn.Identity()
        self.classifier = nn.Linear(d_model, n_classes)

    @property
    def n_heads(self) -> int:
        return self.blocks[0].attn.n_heads

    @property
    def attention_offset(self) -> int:
        """Positions the model puts before the tokens: 1 with the 'cls' readout (its vector at position 0)."""
        return int(self.cls is not None)

    def attention_padding_mask(self, padding_mask: torch.Tensor) -> torch.Tensor:
        """The padding mask of the attention matrices: (B, n) -> (B, offset + n), the cls position real."""
        return nn.functional.pad(padding_mask, (self.attention_offset, 0), value=False)

    def attention_labels(self, tokens: list[str]) -> list[str]:
        """Labels of the attention matrices' rows and columns for one example's token strings."""
        return ["[cls]"] * self.attention_offset + list(tokens)

    def forward(
        self,
        tokens,
        key_padding_mask=None,
        need_weights=False,
        head_mask=None,
        need_balance=False,
        copies=1,
        copied_at=0,
    ):
        x = self.tok_emb(tokens)  # (B, n, d) or (B, n, c, d)
        if x.dim() == 4:
            x = x.sum(dim=2)  # (B, n, d)
        if self.cls is not None:
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1 + n, d)
            if key_padding_mask is not None:
                key_padding_mask = self.attention_padding_mask(key_padding_mask)  # (B, 1 + n)
        x = self.drop(x if self.pos_emb is None else x + self.pos_emb[: x.shape[1]])
        weights, pass_state = [], {}  # the layers' shared state of this pass (MultiHeadAttention.forward)
        for layer, block in enumerate(self.blocks):
            layer_mask = None if head_mask is None else head_mask[..., layer, :]  # (H,) or (B, H) or (K B, H)
            if copies > 1 and layer < copied_at:
                layer_mask = None  # keeps every head (copies: above), the batch passes once
            x, w = block(x, key_padding_mask, need_weights, layer_mask, pass_state)
            if copies > 1 and layer == copied_at:  # the batch's copies part here: what later layers read, copied
                key_padding_mask = None if key_padding_mask is None else copied(key_padding_mask, x.shape[0])
                if "first" in pass_state:  # the value residual's first values
                    pass_state["first"] = copied(pass_state["first"], x.shape[0])
            weights.append(w)
        x = self.final_norm(x)  # (B, n', d)
        if self.readout == "cls":
            x = x[:, 0]  # (B, d)
        elif self.readout == "mean":
            if key_padding_mask is None:
                x = x.mean(dim=1)
            else:
                real = (~key_padding_mask).unsqueeze(-1).to(x.dtype)  # (B, n, 1)
                x = (x * real).sum(dim=1) / real.sum(dim=1).clamp(min=1)  # (B, d)
        elif self.readout == "max":
            if key_padding_mask is not None:
                x = x.masked_fill(key_padding_mask.unsqueeze(-1), torch.finfo(x.dtype).min)  # (B, n, d), pads lose
            x = x.amax(dim=1)  # (B, d)
        logits = self.classifier(x)
        if not need_balance:
            return logits, (weights if need_weights else None)
        balance = pass_state.get("balance", torch.zeros((), dtype=logits.dtype, device=logits.device))
        return logits, (weights if need_weights else None), balance


def count_parameters(model: Encoder) -> dict[str, int]:
    """Total trainable parameters, those inside attention layers, and those outside the embeddings."""
    total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    attention = sum(p.numel() for b in model.blocks for p in b.attn.parameters())
    embedding = sum(p.numel() for n, p in model.named_parameters() if n in ("tok_emb.weight", "pos_emb"))
    return {"total": total, "attention": attention, "non_embedding": total - embedding}


def training_flops_per_token(
    non_embedding: int,
    n_layers: int,
    n: int,
    n_heads: int,
    d_k: int,
    d_v: int,
    maps: int = 1,
    mixes: int = 0,
    per_logit: int = 0,
) -> int:
    """Training FLOPs per token (forward + backward): 6 N + 6 L n (H (c d_k + d_v) + m H^2 + H e) (Kaplan et al.
    2020).

    N counts non-embedding parameters (a design's own among them); the second term is the attention score and
    value matmuls over n positions, which is 12 L n d for d_k = d_v = d / H, with c score maps a head (2:
    differential), m talking-heads mixings of H x H over every query and key, and e more multiply-adds a head and
    logit (multi-token attention: c_q c_k for its convolution, g for its head mixing). Additive scoring's tanh,
    the normalisers, rotary positions and the gates' elementwise products are not counted.
    """
    mixing = mixes * n_heads**2 + n_heads * per_logit
    return 6 * non_embedding + 6 * n_layers * n * (n_heads * (maps * d_k + d_v) + mixing)


def flops_per_token(model: Encoder, seq_len: int) -> int:
    """training_flops_per_token of an Encoder on sequences of seq_len tokens (plus its cls position)."""
    attn = model.blocks[0].attn
    n = seq_len + model.attention_offset
    mixes = (attn.logit_mix is not None) + (attn.weight_mix is not None)
    per_logit = 0 if attn.mta_kernel is None else attn.mta_kernel[0, 0].numel() + attn.mta_mix.shape[-1]
    non_embedding = count_parameters(model)["non_embedding"]
    return training_flops_per_token(
        non_embedding, model.n_layers, n, attn.n_heads, attn.d_k, attn.d_v, attn.maps, mixes, per_logit
    )


def describe(model: Encoder, seq_len: int) -> dict:
    """What a run records about its model: the head sizes as resolved (d_k = d_model / n_heads when not given),
    parameter counts, and training FLOPs per token on sequences of seq_len tokens."""
    attn = model.blocks[0].attn
    params = count_parameters(model)
    return {
        "heads": {"n_heads": attn.n_heads, "d_k": attn.d_k, "d_v": attn.d_v, "n_kv_heads": attn.n_kv_heads},
        "d_ff": model.blocks[0].ff[0].out_features,
        "params": {"total": params["total"], "attention": params["attention"]},
        "flops_per_token": flops_per_token(model, seq_len),
    }
