"""Checks on dlcc's own Python source that no runtime test would catch early."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _redefinitions(body: list[ast.stmt], where: str) -> list[str]:
    """Functions and classes defined twice in one scope: Python keeps the second silently, so
    every caller of the first now calls the second with the wrong arguments. A property's setter
    (`@x.setter`) and `typing.overload` stubs are how Python means it, and are left alone."""
    found, seen = [], {}
    for node in body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        decorators = [ast.unparse(d) for d in getattr(node, "decorator_list", [])]
        if any(d.endswith((".setter", ".deleter")) or d.endswith("overload") for d in decorators):
            continue
        if node.name in seen:
            found.append(f"{where}:{node.lineno}: {node.name} is defined again (first at line {seen[node.name]})")
        seen[node.name] = node.lineno
        if isinstance(node, ast.ClassDef):
            found += _redefinitions(node.body, where)
    return found


def test_no_function_or_class_is_defined_twice_in_one_scope():
    found = []
    for folder in ("dlcc", "scripts", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += _redefinitions(ast.parse(path.read_text()).body, str(path.relative_to(ROOT)))
    assert not found, "\n".join(found)
