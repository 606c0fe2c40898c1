"""The calc tool's arithmetic: digits and `+ - * / ( )`, evaluated exactly.

With `fractions.Fraction`, through `ast`, never `eval`: only characters of the calc alphabet ever reach
the parser, and only integer constants, unary +/- and the four operators are evaluated.
"""
from __future__ import annotations

import ast
from fractions import Fraction


class ExprError(ValueError):
    """A calc expression is not digits and + - * / ( ), or divides by zero."""


_EXPR_CHARS = frozenset("0123456789+-*/() ")


def eval_expr(expr: str) -> Fraction:
    """The exact value of an arithmetic expression over digits and + - * / ( ); ExprError otherwise."""
    bad = [i for i, c in enumerate(expr) if c not in _EXPR_CHARS]
    if bad:
        raise ExprError(f"calc expression {expr!r}: character {expr[bad[0]]!r} at offset {bad[0]} is not a digit "
                        "or one of + - * / ( )")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ExprError(f"calc expression {expr!r}: not well formed at offset {e.offset}") from None
    return _eval_node(tree.body, expr)


_BINOPS = {ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y, ast.Mult: lambda x, y: x * y}


def _eval_node(node: ast.AST, expr: str) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval_node(node.operand, expr)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        x, y = _eval_node(node.left, expr), _eval_node(node.right, expr)
        if isinstance(node.op, ast.Div):
            if y == 0:
                raise ExprError(f"calc expression {expr!r}: division by zero")
            return x / y
        if type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](x, y)
    # Only '//' and '**' can reach here given the character check; both are outside the language.
    raise ExprError(f"calc expression {expr!r}: unsupported construct {type(node).__name__}")
