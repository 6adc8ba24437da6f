"""Procedural bug modifiers on libcst, after SWE-smith's `bug_gen/procedural` families.

Each modifier names the nodes it can change ("sites") inside function bodies; `mutate_source` rewrites
exactly one site, chosen by its index in a fixed (post-order) traversal, so a candidate is reproducible
from (file, modifier, site).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst

_ARITH_CHANGE: dict[type, type] = {
    cst.Add: cst.Subtract,
    cst.Subtract: cst.Add,
    cst.Multiply: cst.FloorDivide,
    cst.Divide: cst.Multiply,
    cst.FloorDivide: cst.Multiply,
    cst.Modulo: cst.FloorDivide,
    cst.Power: cst.Multiply,
    cst.LeftShift: cst.RightShift,
    cst.RightShift: cst.LeftShift,
    cst.BitAnd: cst.BitOr,
    cst.BitOr: cst.BitAnd,
}
_AUG_CHANGE: dict[type, type] = {
    cst.AddAssign: cst.SubtractAssign,
    cst.SubtractAssign: cst.AddAssign,
    cst.MultiplyAssign: cst.FloorDivideAssign,
    cst.DivideAssign: cst.MultiplyAssign,
}
_CMP_FLIP: dict[type, type] = {
    cst.Equal: cst.NotEqual,
    cst.NotEqual: cst.Equal,
    cst.LessThan: cst.GreaterThanEqual,
    cst.LessThanEqual: cst.GreaterThan,
    cst.GreaterThan: cst.LessThanEqual,
    cst.GreaterThanEqual: cst.LessThan,
    cst.In: cst.NotIn,
    cst.NotIn: cst.In,
    cst.Is: cst.IsNot,
    cst.IsNot: cst.Is,
}


def _same_spacing(old: cst.CSTNode, new_type: type) -> cst.CSTNode:
    """The replacement operator keeps the original's whitespace."""
    kwargs = {}
    for attr in ("whitespace_before", "whitespace_after"):
        if hasattr(old, attr):
            kwargs[attr] = getattr(old, attr)
    if new_type in (cst.NotIn, cst.IsNot):
        kwargs["whitespace_between"] = cst.SimpleWhitespace(" ")
    return new_type(**kwargs)


class Modifier:
    name: str = ""
    explanation: str = ""

    def matches(self, node: cst.CSTNode) -> bool:
        raise NotImplementedError

    def mutate(self, node: cst.CSTNode, rng: random.Random) -> cst.CSTNode | cst.RemovalSentinel:
        """Rewrites a node `matches` accepted."""
        raise NotImplementedError

    def not_a_site(self, node: cst.CSTNode) -> TypeError:
        return TypeError(f"{self.name}: {type(node).__name__} is not one of its sites (see matches)")


class OperationChange(Modifier):
    name = "func_pm_op_change"
    explanation = "an arithmetic or bitwise operator is replaced by another one"

    def matches(self, node):
        return (isinstance(node, cst.BinaryOperation) and type(node.operator) in _ARITH_CHANGE) or (
            isinstance(node, cst.AugAssign) and type(node.operator) in _AUG_CHANGE
        )

    def mutate(self, node, rng):
        if isinstance(node, cst.BinaryOperation):
            return node.with_changes(
                operator=_same_spacing(node.operator, _ARITH_CHANGE[type(node.operator)])
            )
        if isinstance(node, cst.AugAssign):
            return node.with_changes(operator=_same_spacing(node.operator, _AUG_CHANGE[type(node.operator)]))
        raise self.not_a_site(node)


class OperationFlip(Modifier):
    name = "func_pm_op_flip"
    explanation = "a comparison or boolean operator is inverted"

    def matches(self, node):
        if isinstance(node, cst.Comparison):
            return len(node.comparisons) == 1 and type(node.comparisons[0].operator) in _CMP_FLIP
        return isinstance(node, cst.BooleanOperation)

    def mutate(self, node, rng):
        if isinstance(node, cst.BooleanOperation):
            new = cst.Or if isinstance(node.operator, cst.And) else cst.And
            return node.with_changes(operator=_same_spacing(node.operator, new))
        if not isinstance(node, cst.Comparison):
            raise self.not_a_site(node)
        target = node.comparisons[0]
        op = _same_spacing(target.operator, _CMP_FLIP[type(target.operator)])
        return node.with_changes(comparisons=[target.with_changes(operator=op)])


class OperationSwap(Modifier):
    name = "func_pm_op_swap"
    explanation = "the operands of a binary operation or comparison are swapped"

    def matches(self, node):
        if isinstance(node, cst.BinaryOperation):
            return not isinstance(node.operator, (cst.Add, cst.Multiply, cst.BitAnd, cst.BitOr, cst.BitXor))
        return (
            isinstance(node, cst.Comparison)
            and len(node.comparisons) == 1
            and isinstance(
                node.comparisons[0].operator,
                (cst.LessThan, cst.LessThanEqual, cst.GreaterThan, cst.GreaterThanEqual),
            )
        )

    def mutate(self, node, rng):
        if isinstance(node, cst.BinaryOperation):
            return node.with_changes(left=node.right, right=node.left)
        if not isinstance(node, cst.Comparison):
            raise self.not_a_site(node)
        target = node.comparisons[0]
        return node.with_changes(
            left=target.comparator, comparisons=[target.with_changes(comparator=node.left)]
        )


class ConstantChange(Modifier):
    name = "func_pm_op_change_const"
    explanation = "an integer constant is off by one"

    def matches(self, node):
        return isinstance(node, cst.Integer)

    def mutate(self, node, rng):
        if not isinstance(node, cst.Integer):
            raise self.not_a_site(node)
        value = int(node.evaluated_value)
        new = value + rng.choice((-1, 1)) if value > 0 else value + 1
        return node.with_changes(value=str(new))


class RemoveAssign(Modifier):
    name = "func_pm_remove_assign"
    explanation = "an assignment statement is removed"

    def matches(self, node):
        return (
            isinstance(node, cst.SimpleStatementLine)
            and len(node.body) == 1
            and isinstance(node.body[0], (cst.Assign, cst.AugAssign))
        )

    def mutate(self, node, rng):
        return cst.RemoveFromParent()


class RemoveConditional(Modifier):
    name = "func_pm_remove_cond"
    explanation = "an if statement without else branch is removed"

    def matches(self, node):
        return isinstance(node, cst.If) and node.orelse is None

    def mutate(self, node, rng):
        return cst.RemoveFromParent()


class RemoveLoop(Modifier):
    name = "func_pm_remove_loop"
    explanation = "a for or while loop is removed"

    def matches(self, node):
        return isinstance(node, (cst.For, cst.While))

    def mutate(self, node, rng):
        return cst.RemoveFromParent()


class InvertIf(Modifier):
    name = "func_pm_ctrl_invert_if"
    explanation = "the bodies of an if/else are swapped"

    def matches(self, node):
        return isinstance(node, cst.If) and isinstance(node.orelse, cst.Else)

    def mutate(self, node, rng):
        if not (isinstance(node, cst.If) and isinstance(node.orelse, cst.Else)):
            raise self.not_a_site(node)
        return node.with_changes(body=node.orelse.body, orelse=node.orelse.with_changes(body=node.body))


MODIFIERS: tuple[Modifier, ...] = (
    OperationChange(),
    OperationFlip(),
    OperationSwap(),
    ConstantChange(),
    RemoveAssign(),
    RemoveConditional(),
    RemoveLoop(),
    InvertIf(),
)
MODIFIERS_BY_NAME = {m.name: m for m in MODIFIERS}


class _SiteTransformer(cst.CSTTransformer):
    """Counts a modifier's sites inside function bodies; rewrites the one numbered `target` (if >= 0)."""

    def __init__(self, modifier: Modifier, target: int, rng: random.Random):
        super().__init__()
        self.modifier, self.target, self.rng = modifier, target, rng
        self.count = 0
        self._function_depth = 0
        self._in_decorator_or_params = 0

    def on_visit(self, node):
        if isinstance(node, cst.FunctionDef):
            self._function_depth += 1
        elif isinstance(node, (cst.Parameters, cst.Decorator, cst.Annotation)):
            self._in_decorator_or_params += 1
        return True

    def on_leave(self, original_node, updated_node):
        result = updated_node
        if isinstance(original_node, cst.FunctionDef):
            self._function_depth -= 1
        elif isinstance(original_node, (cst.Parameters, cst.Decorator, cst.Annotation)):
            self._in_decorator_or_params -= 1
        elif (
            self._function_depth > 0
            and not self._in_decorator_or_params
            and self.modifier.matches(original_node)
        ):
            if self.count == self.target:
                result = self.modifier.mutate(updated_node, self.rng)
            self.count += 1
        return result


def count_sites(module: cst.Module, modifier: Modifier) -> int:
    visitor = _SiteTransformer(modifier, -1, random.Random(0))
    module.visit(visitor)
    return visitor.count


@dataclass(frozen=True)
class Candidate:
    path: str  # relative to the repository root, posix
    modifier: str
    site: int


def enumerate_candidates(
    sources: dict[str, str], modifiers: Sequence[Modifier] = MODIFIERS
) -> list[Candidate]:
    """All (file, modifier, site) triples; files that libcst cannot parse are skipped."""
    out: list[Candidate] = []
    for path in sorted(sources):
        try:
            module = cst.parse_module(sources[path])
        except cst.ParserSyntaxError:
            continue
        for modifier in modifiers:
            out.extend(Candidate(path, modifier.name, i) for i in range(count_sites(module, modifier)))
    return out


def mutate_source(source: str, candidate: Candidate, seed: int) -> str | None:
    """The source with the candidate's site rewritten, or None if that yields no valid, different code."""
    modifier = MODIFIERS_BY_NAME[candidate.modifier]
    rng = random.Random(f"{seed}:{candidate.path}:{candidate.modifier}:{candidate.site}")
    try:
        new = cst.parse_module(source).visit(_SiteTransformer(modifier, candidate.site, rng)).code
        compile(new, candidate.path, "exec")
    except (cst.ParserSyntaxError, SyntaxError, ValueError, cst.CSTValidationError):
        return None
    return new if new != source else None
