"""Associative recall tasks: multi-query associative recall (MQAR) and its fused, multi-key variant.

MQAR (Arora et al. 2023, "Zoology"): a context of key-value pairs, then queries, each a key of the context whose
value must be predicted at the query's position. Token-level: one label per query position, -100 elsewhere.

- fused=False is the task as published: keys and values are separate tokens (k1 v1 k2 v2 ... q1 q2 ...).
- fused=True puts each key and its value in one position (their embeddings are summed), so the model needs only
  one hop of attention per lookup; at CPU scale this is the variant that learns in seconds.
- lookups=2 (fused only) makes each query position name two context keys a and b; the label is
  value(a) - value(b), so the model has to retrieve two positions at once: one head can only average them,
  several heads can fetch one each.

Vocabulary: 0 padding, then n_keys keys, n_values values, and (lookups=2) n_keys second-key tokens.
"""

import numpy as np

from headlab.data.task import Example, positive
from headlab.errors import InvalidSetting
from headlab.model.rules import same


class AssociativeRecall:
    """The Task (headlab.data.task) of MQAR and its fused variants."""

    level = "token"

    def __init__(self, n_keys: int, n_values: int, n_pairs: int, n_queries: int, lookups: int, fused: bool):
        """The settings have no defaults: the data configs (pair_recall, mqar) state each variant whole."""
        self.check(n_keys=n_keys, n_values=n_values, n_pairs=n_pairs, n_queries=n_queries, lookups=lookups, fused=fused)
        self.n_keys, self.n_values, self.n_pairs, self.n_queries = n_keys, n_values, n_pairs, n_queries
        self.lookups, self.fused = lookups, fused
        self.vocab_size = 1 + n_keys + n_values + (n_keys if lookups == 2 else 0)
        self.n_classes = n_values if lookups == 1 else 2 * n_values - 1
        self.max_len = (1 if fused else 2) * n_pairs + n_queries

    @staticmethod
    def check(n_keys, n_values, n_pairs, n_queries, lookups, fused, name=same) -> None:
        for key, value in (("n_keys", n_keys), ("n_values", n_values), ("n_pairs", n_pairs), ("n_queries", n_queries)):
            if not positive(value):
                raise InvalidSetting(name(key), value, "an int >= 1")
        if lookups not in (1, 2):
            raise InvalidSetting(name("lookups"), lookups, "one of 1, 2")
        if not isinstance(fused, bool):
            raise InvalidSetting(name("fused"), fused, "true or false")
        if lookups == 2 and fused is not True:
            rule = f"true when {name('lookups')}=2 (a query position holds both keys)"
            raise InvalidSetting(name("fused"), fused, rule)
        if not lookups <= n_pairs <= n_keys:
            rule = f"between {name('lookups')}={lookups} and {name('n_keys')}={n_keys}"
            raise InvalidSetting(name("n_pairs"), n_pairs, rule)

    @property
    def notation(self) -> str:
        if not self.fused:
            return "kN, vM: key N and value M, a token each, in pairs; then the queries, each a key of the context"
        if self.lookups == 1:
            return "kN+vM: a context position holding key N and its value M; kN: a query for key N (label: its value)"
        return (
            f"kN+vM: a context position holding key N and its value M; kA+bB: a query naming keys A (a) and B (b), "
            f"labelled value(a) - value(b) + {self.n_values - 1}"
        )

    # the roles a query needs to answer: the positions of the keys it names (unfused: and the value after its key)
    RELEVANT_ROLES = ("key a", "key b", "its key", "its value")

    def attention_roles(self, tokens: np.ndarray) -> tuple[list[str], np.ndarray]:
        """What key j is to query i: the context position of a key the query names (key a, key b), another context
        position, or a query position. tokens (B, n) or (B, n, 2) -> roles (B, n, n)."""
        B, n = tokens.shape[:2]
        P = self.n_pairs * (1 if self.fused else 2)
        position = np.arange(n)
        if self.fused:
            held, named = tokens[:, :, 0], tokens[:, :, 0]  # (B, n): the key a position holds / a query names first
            second = tokens[:, :, 1] - self.n_keys - self.n_values  # (B, n): the key token of b (lookups=2)
        else:
            held, named, second = tokens, tokens, np.full_like(tokens, -1)  # keys at even context positions
            held = np.where(position % 2 == 0, tokens, -1)
        is_a = (held[:, None, :] == named[:, :, None]) & (position[None, None, :] < P)  # (B, n, n)
        is_b = (held[:, None, :] == second[:, :, None]) & (position[None, None, :] < P) & (self.lookups == 2)
        names = ["key a", "key b"] if self.lookups == 2 else ["its key"]
        value_of_a = np.zeros_like(is_a)
        if not self.fused:  # the value follows its key
            value_of_a[:, :, 1:] = is_a[:, :, :-1]
            names = ["its key", "its value"]
        context = position[None, None, :] < P
        roles = np.select([is_a, is_b | value_of_a, context], [0, 1, len(names)], default=len(names) + 1)  # (B, n, n)
        return [*names, "other context", "queries"], roles

    @property
    def corruptions(self) -> tuple[str, ...]:
        """The corruptions `corrupt` makes, each named by the role (attention_roles) whose content it changes."""
        if not self.fused:
            return ("its value",)
        return ("key a", "key b") if self.lookups == 2 else ("its key",)

    def corrupt(
        self, rng: np.random.Generator, tokens: np.ndarray, role: str
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A minimally changed copy of a batch whose answer differs at one query of each example (drawn with rng):
        the value stored for the key that query names as `role` (one of `corruptions`) replaced by another value,
        and every label recomputed. tokens (B, n) or (B, n, 2) -> (tokens, labels (B, n), query positions (B,))."""
        if role not in self.corruptions:
            raise InvalidSetting("role", role, "one of " + ", ".join(self.corruptions))
        B, n = tokens.shape[:2]
        P, K, V = self.n_pairs, self.n_keys, self.n_values
        rows, tokens = np.arange(B), tokens.copy()
        query = n - self.n_queries + rng.integers(0, self.n_queries, size=B)  # (B,)
        if self.fused:
            named = tokens[rows, query, 1] - K - V if role == "key b" else tokens[rows, query, 0]  # key tokens (B,)
            where = (tokens[:, :P, 0] == named[:, None]).argmax(1)  # (B,): the context position holding it
            at = (rows, where, 1)
        else:
            where = 2 * (tokens[:, : 2 * P : 2] == tokens[rows, query][:, None]).argmax(1) + 1  # its value's position
            at = (rows, where)
        old = tokens[at] - 1 - K  # (B,) values
        tokens[at] = 1 + K + (old + rng.integers(1, V, size=B)) % V  # another value, uniformly
        return tokens, self.labels(tokens), query

    def labels(self, tokens: np.ndarray) -> np.ndarray:
        """Every example's labels from its tokens, as sample gives them: (B, n) or (B, n, 2) -> (B, n)."""
        B, n = tokens.shape[:2]
        P, Q, K, V = self.n_pairs, self.n_queries, self.n_keys, self.n_values
        if self.fused:
            keys, values, asked = tokens[:, :P, 0], tokens[:, :P, 1] - 1 - K, tokens[:, -Q:]  # (B, P), (B, P)
        else:
            keys, values, asked = tokens[:, : 2 * P : 2], tokens[:, 1 : 2 * P : 2] - 1 - K, tokens[:, -Q:, None]

        def value_of(key_tokens: np.ndarray) -> np.ndarray:  # (B, Q) key tokens -> (B, Q) their values
            return np.take_along_axis(values, (keys[:, None, :] == key_tokens[..., None]).argmax(-1), axis=1)

        target = value_of(asked[..., 0])
        if self.lookups == 2:
            target = target - value_of(asked[..., 1] - K - V) + V - 1
        labels = np.full((B, n), -100, dtype=np.int64)
        labels[:, -Q:] = target
        return labels

    def vocab(self) -> list[str]:
        """Token strings by id, for attention maps."""
        keys = [f"k{i}" for i in range(self.n_keys)]
        second = [f"b{i}" for i in range(self.n_keys)] if self.lookups == 2 else []
        return ["<pad>", *keys, *(f"v{i}" for i in range(self.n_values)), *second]

    def sample(self, rng: np.random.Generator, n: int) -> list[Example]:
        P, Q, K, V = self.n_pairs, self.n_queries, self.n_keys, self.n_values
        keys = rng.permuted(np.tile(np.arange(K), (n, 1)), axis=1)[:, :P]  # (n, P) distinct keys per example
        values = rng.integers(0, V, size=(n, P))  # (n, P)
        asked = rng.random((n, Q, P)).argsort(axis=-1)[..., : self.lookups]  # (n, Q, lookups) distinct pairs
        rows = np.arange(n)[:, None]
        key_tok, value_tok = 1 + keys, 1 + K + values  # (n, P) token ids
        if self.lookups == 1:
            query_tok = key_tok[rows, asked[..., 0]]  # (n, Q)
            target = values[rows, asked[..., 0]]  # (n, Q)
        else:
            a, b = asked[..., 0], asked[..., 1]
            query_tok = np.stack([key_tok[rows, a], 1 + K + V + keys[rows, b]], axis=-1)  # (n, Q, 2)
            target = values[rows, a] - values[rows, b] + V - 1  # (n, Q), in [0, 2V - 1)
        if self.fused:
            context = np.stack([key_tok, value_tok], axis=-1)  # (n, P, 2)
            if self.lookups == 1:
                query_tok = np.stack([query_tok, np.zeros_like(query_tok)], axis=-1)  # (n, Q, 2)
        else:
            context = np.stack([key_tok, value_tok], axis=-1).reshape(n, 2 * P)  # (n, 2P) k1 v1 k2 v2 ...
        tokens = np.concatenate([context, query_tok], axis=1)  # (n, T) or (n, T, 2)
        labels = np.full((n, tokens.shape[1]), -100, dtype=np.int64)
        labels[:, -Q:] = target
        return list(zip(tokens.astype(np.int64), labels, strict=True))
