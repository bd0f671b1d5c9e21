"""Config reaches code typed, and only the config layer decides a key's value.

- Every function parameter that carries a config (named `cfg`, `config`, `*_cfg`, `fcfg`,
  `tc`, `dc`, ... : CONFIG_PARAM) has a type annotation, and not `Any` or `object`: the
  reader sees which section it is (`fcfg: FeaturesConfig`), and a wrong one is a visible
  mistake. Counted over the code outside tests/ (54 such parameters when issue #68 was
  filed; 62 by this rule, 12 of them `Any`, before they were typed).
- No field of the config schema (core/config/) is typed `Any`.
- The libraries never set a config key (`with_overrides`): a derived setting, like
  train.grow's phone stage training without the phone term, is the config layer's
  (core.config.phone_stage) or the app's.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ["core", "tasks", "alignment", "training", "decoding", "serving", "amflow", "bench",
        "dags", "plugins", "scripts", "infra"]
LIBRARIES = ["tasks", "alignment", "training", "decoding", "serving"]
CONFIG_PARAM = re.compile(r"(cfg|config|conf)$|^(tc|sc|dc|lc|mc|pc|fc|rc|cc)$")
UNTYPED = ("Any", "object", "typing.Any")


def _trees(folders: list[str]):
    for top in folders:
        for path in sorted((ROOT / top).rglob("*.py")):
            yield path.relative_to(ROOT), ast.parse(path.read_text())


def untyped_config_params(folders: list[str] = CODE) -> list[str]:
    """'path:line function(param)' for each config parameter without a real type."""
    out = []
    for path, tree in _trees(folders):
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = node.args
            for arg in a.posonlyargs + a.args + a.kwonlyargs:
                if not CONFIG_PARAM.search(arg.arg):
                    continue
                if arg.annotation is None or ast.unparse(arg.annotation) in UNTYPED:
                    out.append(f"{path}:{node.lineno} {node.name}({arg.arg})")
    return out


def test_every_config_parameter_has_a_type():
    found = untyped_config_params()
    assert not found, (f"{len(found)} config parameters without a type (annotate them with "
                       "their section, e.g. fcfg: FeaturesConfig):\n" + "\n".join(found))


def test_the_rule_catches_an_untyped_and_an_any_config_parameter(tmp_path, monkeypatch):
    pkg = tmp_path / "tasks"
    pkg.mkdir()
    (pkg / "x.py").write_text("from typing import Any\n"
                              "def f(fcfg, n: int, tc: Any, cfg: 'Config', conf: dict):\n"
                              "    pass\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert untyped_config_params(["tasks"]) == ["tasks/x.py:2 f(fcfg)", "tasks/x.py:2 f(tc)"]


def test_no_schema_field_is_typed_any():
    found = []
    for path, tree in _trees(["core/config"]):
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            found += [f"{path}:{f.lineno} {cls.name}.{f.target.id}" for f in cls.body
                      if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)
                      and ast.unparse(f.annotation) in UNTYPED]
    assert not found, "config fields typed Any:\n" + "\n".join(found)


def test_libraries_never_set_a_config_key():
    found = []
    for path, tree in _trees(LIBRARIES):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name == "with_overrides":
                    found.append(f"{path}:{node.lineno}")
    assert not found, ("library code sets config keys (derive the value in core/config or "
                       "in the step):\n" + "\n".join(found))
