"""ListOps (Nangia & Bowman 2018): nested MIN / MAX / MED / SM expressions over digits, label = the value.

The generator follows the original make_data.py: below the root a node is an operator with probability 0.25 and
a digit otherwise, an operator takes 2 to max_args arguments, and depth is capped at max_depth. The root is always
an operator. The model sees the expression without the parentheses of the released files (they carry no
information once each operator ends with "]"); `to_string` writes the released format, `evaluate_string` reads it.
"""

import numpy as np

from headlab.data.task import positive
from headlab.errors import InvalidSetting
from headlab.model.rules import same

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
VOCAB = ("<pad>", *OPERATORS, END, *(str(d) for d in range(10)))
TOKEN_ID = {tok: i for i, tok in enumerate(VOCAB)}

Tree = int | tuple[str, list["Tree"]]


def apply(op: str, args: list[int]) -> int:
    """The value of one operator node; MED is the integer median (np.median truncated), SM the sum mod 10."""
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[MED":
        s = sorted(args)
        return (s[(len(s) - 1) // 2] + s[len(s) // 2]) // 2
    if op == "[SM":
        return sum(args) % 10
    raise ValueError(f"unknown ListOps operator {op!r}")


def evaluate(tree: Tree) -> int:
    if isinstance(tree, int):
        return tree
    op, args = tree
    return apply(op, [evaluate(a) for a in args])


def evaluate_string(expression: str) -> int:
    """Evaluate an expression in the released format (parentheses optional) with a stack."""
    stack: list[tuple[str, list[int]]] = []
    value = None
    for tok in expression.split():
        if tok in "()":
            continue
        if tok in OPERATORS:
            stack.append((tok, []))
            continue
        value = apply(*stack.pop()) if tok == END else int(tok)
        if stack:
            stack[-1][1].append(value)
    if stack or value is None:
        raise ValueError(f"malformed ListOps expression: {expression[:60]!r}")
    return value


def tokens(tree: Tree) -> list[str]:
    """The expression without parentheses: [MAX 2 9 ] ..."""
    if isinstance(tree, int):
        return [str(tree)]
    op, args = tree
    return [op, *(t for a in args for t in tokens(a)), END]


def to_string(tree: Tree) -> str:
    """The released format, whose parentheses follow the original left-nested tuples: ( ( [MAX 2 ) 9 ) ] )."""
    if isinstance(tree, int):
        return str(tree)
    op, args = tree
    s = f"( {op} {to_string(args[0])} )"
    for a in args[1:]:
        s = f"( {s} {to_string(a)} )"
    return f"( {s} {END} )"


class ListOps:
    """The Task (headlab.data.task) of ListOps expressions."""

    level = "sequence"
    vocab_size = len(VOCAB)
    n_classes = 10
    notation = "[MIN [MAX [MED [SM: operators (SM: sum mod 10, MED: integer median), ]: the end of their arguments"

    def __init__(self, max_depth: int = 5, max_args: int = 5, max_length: int = 100, operator_p: float = 0.25):
        self.check(max_depth=max_depth, max_args=max_args, max_length=max_length, operator_p=operator_p)
        self.max_depth, self.max_args, self.max_length, self.operator_p = max_depth, max_args, max_length, operator_p
        self.max_len = max_length

    @staticmethod
    def check(max_depth, max_args, max_length, operator_p, name=same) -> None:
        for key, value in (("max_depth", max_depth), ("max_length", max_length)):
            if not positive(value):
                raise InvalidSetting(name(key), value, "an int >= 1")
        if not positive(max_args) or max_args < 2:
            raise InvalidSetting(name("max_args"), max_args, "an int >= 2")
        if not isinstance(operator_p, int | float) or isinstance(operator_p, bool) or not 0 <= operator_p < 1:
            raise InvalidSetting(name("operator_p"), operator_p, "a number in [0, 1)")

    def vocab(self) -> list[str]:
        return list(VOCAB)

    def tree(self, rng: np.random.Generator, depth: int = 1) -> Tree:
        if depth > 1 and (depth >= self.max_depth or rng.random() >= self.operator_p):
            return int(rng.integers(10))
        n_args = int(rng.integers(2, self.max_args + 1))
        return OPERATORS[rng.integers(len(OPERATORS))], [self.tree(rng, depth + 1) for _ in range(n_args)]

    def sample(self, rng: np.random.Generator, n: int) -> list[tuple[np.ndarray, int]]:
        out = []
        while len(out) < n:  # rejection keeps the length cap without biasing the shape of short trees
            t = self.tree(rng)
            toks = tokens(t)
            if len(toks) <= self.max_length:
                out.append((np.array([TOKEN_ID[s] for s in toks], dtype=np.int64), evaluate(t)))
        return out
