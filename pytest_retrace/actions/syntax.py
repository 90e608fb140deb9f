"""Reading model-written Python call syntax without running any of it (pyautogui code, UI-TARS calls): parsing
with every failure an :class:`ActionError`, and naming a rejected node in an error message without printing
anything huge or deep."""

from __future__ import annotations

import ast
import warnings
from typing import Any, Literal

from pytest_retrace.actions.action import ActionError
from pytest_retrace.actions.limits import MAX_NUMBER
from pytest_retrace.text import clip

_CALLEE_NODES = 40  # ast.unparse recurses: a callee larger than this is described, not printed


def parse_python(code: str, mode: Literal["exec", "eval"], what: str) -> ast.AST:
    """``ast.parse(code)``; a syntax error names its line in "exec" mode (a one-line "eval" has no other)."""
    try:
        # Invalid escapes like '\d' in a typed string only warn; they must not fail (or spam) the run.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(code, mode=mode)
    except SyntaxError as exc:
        where = f"line {exc.lineno}: " if exc.lineno and mode == "exec" else ""
        raise ActionError(f"{where}syntax error: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurdly deep nesting
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise ActionError(f"{what} cannot be parsed ({detail})") from None


def is_huge(value: Any) -> bool:
    """An integer too large to convert to float or print (checked without doing either)."""
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_NUMBER


def describe(node: ast.expr) -> str:
    """Name a rejected argument node in terms a model author understands."""
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    if isinstance(node, ast.JoinedStr):
        return "an f-string"
    if isinstance(node, ast.BinOp):
        return "an arithmetic expression"
    if isinstance(node, ast.Call):
        return "a call"
    if isinstance(node, ast.Constant):
        return f"a constant of type {type(node.value).__name__}"
    return f"an expression of type {type(node).__name__}"


def callee(func: ast.expr) -> str:
    """Readable name of what is being called, for error messages (never evaluated)."""
    # ast.walk is iterative; counting its nodes first keeps `a.a.a....a()` (thousands deep, which ast.parse
    # accepts) from exhausting the stack inside ast.unparse, and `0xfff...()` must not reach int.__repr__.
    nodes = [node for _, node in zip(range(_CALLEE_NODES + 1), ast.walk(func))]
    if len(nodes) > _CALLEE_NODES:
        return f"a long {type(func).__name__.lower()} expression"
    if any(isinstance(node, ast.Constant) and is_huge(node.value) for node in nodes):
        kind = type(func).__name__.lower()
        return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} expression holding a huge number"
    return clip(ast.unparse(func), 60)
