"""Read a hyperpyyaml config (CosyVoice3's cosyvoice3.yaml, GLM-TTS's) as data: tags are
recorded, never executed.

hyperpyyaml's `!new:`/`!name:`/`!apply:` tags would import and call arbitrary Python named
in the file. We parse them into plain dicts instead:

  !new:pkg.Class {k: v}   -> {"__class__": "pkg.Class", "k": v}
  !name:pkg.func {k: v}   -> {"__name__": "pkg.func", "k": v}
  !apply:pkg.func [args]  -> {"__apply__": "pkg.func", "args": [...]}
  !ref <key>              -> the value of top-level `key` (arithmetic such as
                             `<chunk_size> * <token_mel_ratio>` is evaluated on numbers only)
"""
from __future__ import annotations

import ast
import operator
import re
from pathlib import Path
from collections.abc import Mapping
from typing import Any

import yaml


class _Ref(str):
    """A `!ref` expression waiting for resolution."""


class _Loader(yaml.SafeLoader):
    pass


def _tagged(kind: str):
    def construct(loader: _Loader, suffix: str, node: yaml.Node):
        if isinstance(node, yaml.MappingNode):
            body = loader.construct_mapping(node, deep=True)
            return {kind: suffix, **body}
        if isinstance(node, yaml.SequenceNode):
            return {kind: suffix, "args": loader.construct_sequence(node, deep=True)}
        value = loader.construct_scalar(node)
        return {kind: suffix, **({"args": [value]} if value not in ("", None) else {})}
    return construct


_Loader.add_multi_constructor("!new:", _tagged("__class__"))
_Loader.add_multi_constructor("!name:", _tagged("__name__"))
_Loader.add_multi_constructor("!apply:", _tagged("__apply__"))
_Loader.add_constructor("!ref", lambda loader, node: _Ref(loader.construct_scalar(node)))

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.USub: operator.neg}


def _arith(node: ast.AST):
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.left), _arith(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.operand))
    raise ValueError("only numbers and + - * / are allowed in !ref expressions")


def _lookup(root: dict, dotted: str, path: Path):
    value: Any = root
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ValueError(f"{path}: !ref <{dotted}> names no key")
        value = value[part]
    return value


def _resolve(value, root: dict, path: Path, depth: int = 0):
    if depth > 32:
        raise ValueError(f"{path}: !ref cycle")
    if isinstance(value, _Ref):
        names = re.findall(r"<([^<>]+)>", value)
        if len(names) == 1 and value.strip() == f"<{names[0]}>":  # a plain reference
            return _resolve(_lookup(root, names[0], path), root, path, depth + 1)
        expr = value
        for name in names:
            resolved = _resolve(_lookup(root, name, path), root, path, depth + 1)
            if not isinstance(resolved, (int, float)):
                raise ValueError(f"{path}: !ref {value!r}: <{name}> is not a number")
            expr = expr.replace(f"<{name}>", repr(resolved))
        try:
            return _arith(ast.parse(expr, mode="eval"))
        except (SyntaxError, ValueError) as exc:
            raise ValueError(f"{path}: cannot evaluate !ref {value!r}: {exc}") from None
    if isinstance(value, dict):
        return {k: _resolve(v, root, path, depth) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, root, path, depth) for v in value]
    return value


def load_hyperpyyaml(path: str | Path, overrides: dict | None = None) -> dict:
    """Parse a hyperpyyaml file into plain data, with `!ref`s resolved."""
    path = Path(path)
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: not readable as hyperpyyaml: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: top level must be a mapping")
    raw.update(overrides or {})
    return _resolve(raw, raw, path)


def kwargs_of(block: Mapping[str, Any]) -> dict:
    """Constructor keyword arguments of a `!new:` block (its tag removed)."""
    return {k: v for k, v in block.items() if k != "__class__"}
