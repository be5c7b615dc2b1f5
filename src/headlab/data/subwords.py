"""Subword vocabularies (WordPiece and BPE) learned deterministically: the same texts and settings give the same
vocabulary, byte for byte, on any machine, in any process, with any number of threads.

The algorithm is the one `tokenizers` trains with (byte-pair merges over word counts; WordPiece's vocabulary is
BPE's with "##" before every piece that continues a word): start from the characters, repeatedly merge the most
frequent adjacent pair of symbols. `tokenizers` breaks ties between equally frequent pairs by ids that follow
hash-map order, so its vocabularies differ from run to run; here ties go to the smallest pair by its strings, and
nothing depends on the order of a hash. Encoding stays with `tokenizers` (headlab.data.text_pipeline).
"""

import heapq
from collections import Counter

Pair = tuple[str, str]


def word_counts(texts, normalizer, pre_tokenizer) -> Counter:
    """How often each word occurs in the texts, words as `tokenizers` splits them (normalized, pre-tokenized)."""
    counts: Counter = Counter()
    for text in texts:
        counts.update(word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)))
    return counts


def _split(word: str, prefix: str) -> list[str]:
    return [word[0], *(prefix + c for c in word[1:])] if word else []


def _pairs(symbols: list[str]) -> Counter:
    return Counter(zip(symbols, symbols[1:], strict=False))


def _merge(symbols: list[str], pair: Pair, joined: str) -> list[str]:
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            out.append(joined)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def learn(counts: Counter, vocab_size: int, special: list[str], prefix: str = "") -> tuple[list[str], list[Pair]]:
    """(vocabulary in id order, merges in rank order): the special tokens, the alphabet (sorted), then one token per
    merge, until vocab_size tokens or no pair is left. prefix: what marks a piece that continues a word ("##" for
    WordPiece, "" for BPE)."""
    words = sorted(counts)  # a fixed order: the counts' own order follows the texts
    symbols = [_split(w, prefix) for w in words]
    weight = [counts[w] for w in words]
    vocab = list(dict.fromkeys([*special, *sorted({s for word in symbols for s in word})]))
    known = set(vocab)
    pair_count: Counter = Counter()
    holders: dict[Pair, set[int]] = {}  # pair -> indices of the words that hold it
    for i, word in enumerate(symbols):
        for pair, n in _pairs(word).items():
            pair_count[pair] += n * weight[i]
            holders.setdefault(pair, set()).add(i)
    heap = [(-n, pair) for pair, n in pair_count.items()]  # most frequent first; ties: the smallest pair
    heapq.heapify(heap)
    merges: list[Pair] = []
    while len(vocab) < vocab_size and heap:
        negative, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negative or negative == 0:
            continue  # a stale entry: the pair's count changed since it was pushed
        a, b = pair
        joined = a + (b[len(prefix) :] if prefix and b.startswith(prefix) else b)
        merges.append(pair)
        if joined not in known:
            vocab.append(joined)
            known.add(joined)
        changed: set[Pair] = set()
        for i in sorted(holders.pop(pair)):
            before = _pairs(symbols[i])
            symbols[i] = _merge(symbols[i], pair, joined)
            after = _pairs(symbols[i])
            for p in before.keys() | after.keys():
                delta = (after[p] - before[p]) * weight[i]
                if delta:
                    pair_count[p] += delta
                    changed.add(p)
                if after[p]:
                    holders.setdefault(p, set()).add(i)
                elif p in holders:
                    holders[p].discard(i)
        del pair_count[pair]
        for p in sorted(changed - {pair}):
            if pair_count[p] > 0:
                heapq.heappush(heap, (-pair_count[p], p))
    return vocab, merges
