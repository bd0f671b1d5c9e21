"""The docs site's generated pages and its nav: an mkdocs hook (mkdocs.yml `hooks:`).

- reference/cli.md from `amflow.cli.build_parser()`: every subcommand, every flag, its help.
- reference/config.md from the config schema: every dataclass reachable from
  `core.config.Config`, each key with its dotted name (as a user writes it: `train.lr`,
  not the internal section), type, default and meaning. The meaning is the field's
  trailing `# comment` and the comment lines right above it in the class source, so a field
  added to a section shows up here with no other edit. Keys without a comment are listed
  with an empty meaning and named in a warning on stderr (not an mkdocs warning: a strict
  build does not fail on them).
- The nav, built from the folders (so a page dropped into docs/how-to/ is listed with no
  edit): the sections in SECTIONS' order, pinned pages first (those that exist), then the
  rest by file name; results newest first. A page's title is its first `# heading`.

The generated pages are also committed (docs/reference/cli.md, config.md), so links to
them from Markdown resolve in a repository browser too; the build replaces them with a
fresh generation, and tests/test_docs.py fails when the committed copies are stale:
`python scripts/docs_reference.py` rewrites them (`--check`: only says whether they are
current). They are generated in a fixed environment (`_stable_env`: argparse's usage
wrapping and the `--log-level` default read the environment), so the same code gives the
same bytes on every machine.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import inspect
import io
import json
import os
import sys
import textwrap
import tokenize
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig

ROOT = Path(__file__).resolve().parents[1]

# Folder -> (nav title, pages listed first when they exist).
SECTIONS: dict[str, tuple[str, list[str]]] = {
    "tutorial": ("Tutorial", ["quickstart.md", "demo.md"]),
    # Pages other helpers add land in these places when they exist; any other page follows
    # by file name.
    "how-to": ("How-to guides", ["installation.md", "end-to-end.md", "own-corpus.md", "import.md",
                                 "daily-data.md",
                                 "s3.md", "airflow.md", "ec2-cluster.md", "rehearsal.md",
                                 "containers.md", "choose-a-trainer.md", "decode-and-score.md",
                                 "export.md", "serving.md", "benchmarks.md", "troubleshooting.md"]),
    "reference": ("Reference", ["cli.md", "config.md", "run-layout.md", "corpus-format.md",
                                "json-contracts.md"]),
    "explanation": ("Explanation", ["architecture.md", "method.md", "trainers.md",
                                    "alignment.md", "design-choices.md"]),
    "results": ("Results log", []),
}
GENERATED = {"reference/cli.md": "cli", "reference/config.md": "config"}
# The libraries whose Python API is documented (reference/api/<package>.md, and an index)
API_PACKAGES = ["core", "tasks", "alignment", "training", "decoding", "serving"]
API_DIR = "reference/api"
# Documented elsewhere: the config schema's sections are the config reference (every key,
# its type, default and meaning), so core.config shows its package docstring only.
API_SKIP = ("core.config.",)


# ---------------------------------------------------------------- config reference

def field_comments(cls: type) -> dict[str, str]:
    """Field name -> its comments (the comment lines right above it, then its trailing
    comment), read from the source of `cls` and of the dataclasses it inherits from."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            src = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # no source (made at run time): no meanings
            continue
        out.update(_class_comments(src))
    return out


def _class_comments(src: str) -> dict[str, str]:
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, the line is only a comment)
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = (tok.string.lstrip("#").strip(),
                                      tok.line.strip().startswith("#"))
    classdef = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef))
    out = {}
    for node in classdef.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above, line = [], node.lineno - 1
        while line in comments and comments[line][1]:
            above.insert(0, comments[line][0])
            line -= 1
        trailing = [comments[n][0] for n in range(node.lineno, node.end_lineno + 1)
                    if n in comments and not comments[n][1]]
        out[node.target.id] = _join(" ".join(above), " ".join(trailing))
    return out


def _join(above: str, trailing: str) -> str:
    """The comment block above a field, then its trailing comment as a sentence of its own."""
    if above and trailing:
        return f"{above.rstrip('.')}. {trailing[0].upper()}{trailing[1:]}"
    return above or trailing


@dataclasses.dataclass
class Key:
    name: str  # dotted, as a user writes it
    type: str
    default: Any
    meaning: str


def _type_name(tp: Any) -> str:
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def schema_keys(cls: type, user: dict | None, prefix: str = "") -> list[Key]:
    """Every leaf key under dataclass `cls`. `user` is the mapping a user writes for it
    (`to_dict()`): a dataclass field whose name is not in it is an internal section whose
    keys the user writes flat (`train.lr` for TrainConfig.optim.lr)."""
    hints = typing.get_type_hints(cls)
    meanings = field_comments(cls)
    keys: list[Key] = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            if user is None or f.name in user:
                sub = user.get(f.name) if isinstance(user, dict) else None
                keys += schema_keys(tp, sub, f"{prefix}{f.name}.")
            else:  # flattened section
                keys += schema_keys(tp, user, prefix)
            continue
        keys.append(Key(prefix + f.name, _type_name(tp), _default(f), meanings.get(f.name, "")))
    return keys


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _html_escaped(text: str) -> str:
    """Text with <tag> shown as written, not taken for HTML (outside `code spans`, which
    show it as written anyway)."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # the even parts lie outside code spans
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def _prose(text: str) -> str:
    """A table cell of free text, <tag> shown as written."""
    return _html_escaped(_cell(text))


def _doc(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    return "" if doc.startswith(cls.__name__ + "(") else doc  # dataclass's made-up docstring


def config_reference(root: type | None = None) -> tuple[str, list[str]]:
    """The config reference page (Markdown) and the keys that have no comment."""
    if root is None:
        from core.config import Config as root
    user = root().to_dict() if hasattr(root, "to_dict") else None
    lines = ["# Config reference", "",
             "Generated from the config schema (`core.config.Config` and the dataclasses it "
             "reaches) when the docs are built: every key a YAML file or `--set key=value` "
             "may set, its type, its default and what it means (the comment on its field). "
             "An unknown key or a bad value fails at load with a message naming the key. "
             "`train.*` keys are written flat (`train.lr`), whatever section holds them. "
             "`amflow config show` prints a config's resolved values and where each came "
             "from (the defaults below, a config file, a recipe, `--set`).", ""]
    hints = typing.get_type_hints(root)
    missing: list[str] = []
    for f in dataclasses.fields(root):
        tp = hints[f.name]
        lines += [f"## {f.name}", ""]
        if dataclasses.is_dataclass(tp):
            doc = _doc(tp)
            lines += [doc, ""] if doc else []
            sub = user.get(f.name) if isinstance(user, dict) else None
            keys = schema_keys(tp, sub, f.name + ".")
        else:
            keys = [Key(f.name, _type_name(tp), _default(f), field_comments(root).get(f.name, ""))]
        lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        for k in keys:
            default = json.dumps(k.default, default=str)
            lines.append(f"| `{k.name}` | `{_cell(k.type)}` | `{_cell(default)}` | {_prose(k.meaning)} |")
            if not k.meaning:
                missing.append(k.name)
        lines.append("")
    return "\n".join(lines), missing


# ---------------------------------------------------------------- CLI reference

def _flag_row(a: argparse.Action) -> str:
    name = ", ".join(f"`{o}`" for o in a.option_strings) or f"`{a.metavar or a.dest}`"
    if a.choices:
        value = " \\| ".join(f"`{c}`" for c in a.choices)
    elif a.nargs == 0:
        value = ""
    else:
        value = f"`{a.metavar or a.dest.upper()}`"
    if a.nargs in ("+", "*"):
        value += " ..."
    default = "" if a.default in (None, [], False, argparse.SUPPRESS) or a.required \
        else f"`{a.default}`"
    help_text = (a.help or "") % {"default": a.default, "prog": "amflow"} if a.help else ""
    need = "yes" if a.required or not a.option_strings else ""
    return f"| {name} | {value} | {need} | {default} | {_prose(help_text)} |"


def cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """The CLI reference page (Markdown): every subcommand of the parser and its flags."""
    if parser is None:
        from amflow.cli import build_parser
        parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    lines = ["# CLI reference", "",
             "Generated from the argparse parser of `amflow/cli.py` when the docs are built. "
             "Every step is one command, the same one Airflow, a container or a Ray job runs:",
             "", "```text", parser.format_usage().strip(), "```", "",
             _prose(parser.description or ""), "", "| step | what it does |", "|---|---|"]
    helps = {a.dest: a.help for a in sub._get_subactions()}
    lines += [f"| [`{n}`](#amflow-{n}) | {_prose(helps.get(n) or '')} |" for n in sub.choices]
    for name, p in sub.choices.items():
        described = [textwrap.fill(line, 88, subsequent_indent="        ")
                     for line in (p.description or "").strip().splitlines()]
        lines += ["", f"## amflow {name}", "", "```text", p.format_usage().strip(), "",
                  *described, "```", "",
                  "| flag | value | required | default | meaning |", "|---|---|---|---|---|"]
        lines += [_flag_row(a) for a in p._actions if not isinstance(a, argparse._HelpAction)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- Python API reference
#
# Read from the source with `ast`, not by importing it: no library is imported (torch, Ray,
# the decoders), nothing runs, and the pages are the same on every machine. A module is
# public unless a part of its dotted name starts with `_` (or API_SKIP names it); its
# public names are the top-level functions and classes whose names do not, and a class's
# public methods and `__init__`.


def _docstring_md(doc: str | None) -> list[str]:
    """A docstring as Markdown: its prose with <tags> shown as written, and each run of
    indented lines (the layouts docstrings draw: columns, examples) as a text block."""
    if not doc:
        return []
    out: list[str] = []
    block: list[str] = []

    def flush() -> None:
        while block and not block[-1].strip():
            block.pop()
        if block:
            out.extend(([""] if out and out[-1] else []) + ["```text",
                       *textwrap.dedent("\n".join(block)).splitlines(), "```", ""])
        block.clear()

    for line in doc.splitlines():
        if line.startswith("    ") or (block and not line.strip()):
            block.append(line)  # an indented run goes on across blank lines
        else:
            flush()
            out.append(_html_escaped(line))
    flush()
    while out and not out[-1]:
        out.pop()
    return out + [""]


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    ret = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    return f"{node.name}({ast.unparse(node.args)}){ret}"


def _public(name: str) -> bool:
    return not name.startswith("_")


def _function_md(node, level: str, owner: str = "") -> list[str]:
    kind = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    deco = [f"@{ast.unparse(d)}" for d in node.decorator_list]
    return [f"{level} `{owner}{node.name}`", "", "```python", *deco,
            f"{kind} {_signature(node)}", "```", "", *_docstring_md(ast.get_docstring(node))]


def _class_md(node: ast.ClassDef) -> list[str]:
    bases = ", ".join(ast.unparse(b) for b in node.bases + node.keywords)
    deco = [f"@{ast.unparse(d)}" for d in node.decorator_list]
    lines = [f"### `{node.name}`", "", "```python", *deco,
             f"class {node.name}" + (f"({bases})" if bases else ""), "```", "",
             *_docstring_md(ast.get_docstring(node))]
    fields = [f"{ast.unparse(s.target)}: {ast.unparse(s.annotation)}"
              + (f" = {ast.unparse(s.value)}" if s.value else "")
              for s in node.body if isinstance(s, ast.AnnAssign) and _public(ast.unparse(s.target))]
    if fields:
        lines += ["Fields:", "", "```python", *fields, "```", ""]
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                (_public(item.name) or item.name == "__init__"):
            lines += _function_md(item, "####", f"{node.name}.")
    return lines


def api_modules(package: str, root: Path = ROOT) -> list[tuple[str, Path]]:
    """(dotted name, file) of the package's public modules, in name order (the package's
    own __init__ first)."""
    out = []
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        if all(_public(p) for p in parts) and not name.startswith(API_SKIP):
            out.append((name, path))
    return sorted(out)


def module_md(name: str, path: Path, root: Path = ROOT) -> list[str]:
    """A module's section: its docstring, then its public classes and functions in the
    order of the source."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lines = [f"## {name}", "", f"`{path.relative_to(root)}`", "",
             *_docstring_md(ast.get_docstring(tree))]
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and _public(node.name):
            lines += _class_md(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(node.name):
            lines += _function_md(node, "###")
    return lines


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = doc.strip().split("\n\n", 1)[0].replace("\n", " ")
    return _prose(first)


def api_reference(root: Path = ROOT) -> dict[str, str]:
    """{uri: Markdown} of the Python API pages: an index and a page per package."""
    pages: dict[str, str] = {}
    index = ["# Python API reference", "",
             "Generated from the libraries' docstrings and signatures (read from the source: "
             "`scripts/docs_reference.py`), like the [CLI](../cli.md) and [config](../config.md) "
             "references. The libraries are called on plain paths and values, with no run, "
             "step or config file ([architecture](../../explanation/architecture.md)); the "
             "app (`amflow/`) is the CLI, documented in the CLI reference.", ""]
    for package in API_PACKAGES:
        modules = api_modules(package, root)
        title = f"# Python API: {package}"
        body = [title, "", f"Generated from the docstrings and signatures of `{package}/` "
                "(`scripts/docs_reference.py`); [all libraries](index.md).", ""]
        index += [f"## [{package}]({package}.md)", "", "| module | what it is |", "|---|---|"]
        for name, path in modules:
            anchor = name.replace(".", "")
            index.append(f"| [`{name}`]({package}.md#{anchor}) | {_summary(path)} |")
            body += module_md(name, path, root)
        index.append("")
        pages[f"{API_DIR}/{package}.md"] = "\n".join(body).rstrip() + "\n"
    pages[f"{API_DIR}/index.md"] = "\n".join(index).rstrip() + "\n"
    return pages


# ---------------------------------------------------------------- mkdocs hooks

def _title(path: Path) -> str | None:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return None


def build_nav(docs: Path) -> list:
    """The nav from the folders: SECTIONS' order, pinned pages first, results newest first."""
    nav: list = [{"Home": "index.md"}] if (docs / "index.md").exists() else []
    for folder, (title, pinned) in SECTIONS.items():
        names = {p.name for p in (docs / folder).glob("*.md")}
        if folder == "reference":
            names |= {Path(g).name for g in GENERATED if Path(g).parent.name == folder}
        if not names:
            continue
        rest = sorted(names - set(pinned), reverse=(folder == "results"))
        first = [n for n in pinned if n in names]
        if "index.md" in rest:
            rest.remove("index.md")
            first.insert(0, "index.md")
        pages: list = [f"{folder}/{n}" for n in first + rest]
        if folder == "reference":  # the Python API: a section of its own, its index first
            api = [f"{API_DIR}/index.md"] + [f"{API_DIR}/{p}.md" for p in API_PACKAGES]
            pages.append({"Python API": api})
        nav.append({title: pages})
    return nav


# ---------------------------------------------------------------- the generated pages

@contextlib.contextmanager
def _stable_env():
    """The environment the pages are generated in: a fixed terminal width (argparse wraps
    usage lines to it) and no AMFLOW_LOG_LEVEL (the `--log-level` default)."""
    saved = {k: os.environ.get(k) for k in ("COLUMNS", "AMFLOW_LOG_LEVEL")}
    os.environ["COLUMNS"] = "100"
    os.environ.pop("AMFLOW_LOG_LEVEL", None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def generated_pages() -> tuple[dict[str, str], list[str]]:
    """{uri under docs/: content} of the generated pages, and the config keys without a
    comment."""
    with _stable_env():
        config_md, missing = config_reference()
        made = {"cli": cli_reference(), "config": config_md}
    pages = {uri: made[what] for uri, what in GENERATED.items()}
    return pages | api_reference(), missing


def main(argv: list[str], docs: Path = ROOT / "docs") -> int:
    """Write the generated pages under `docs` (`--check`: exit 1 when they are stale)."""
    sys.path.insert(0, str(ROOT))
    pages, _ = generated_pages()
    stale = [uri for uri, content in pages.items()
             if not (docs / uri).exists() or (docs / uri).read_text(encoding="utf-8") != content]
    if "--check" in argv:
        for uri in stale:
            print(f"docs/{uri} is stale: run `python scripts/docs_reference.py`", file=sys.stderr)
        return 1 if stale else 0
    for uri in stale:
        (docs / uri).parent.mkdir(parents=True, exist_ok=True)
        (docs / uri).write_text(pages[uri], encoding="utf-8")
        print(f"wrote docs/{uri}")
    return 0


def on_config(config: MkDocsConfig, **kwargs):
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # this checkout's code, not an installed amflow
    if not config.get("nav"):
        config["nav"] = build_nav(Path(config["docs_dir"]))
    return config


def on_files(files, config: MkDocsConfig, **kwargs):
    from mkdocs.structure.files import File

    pages, missing = generated_pages()
    if missing:
        print(f"WARNING (not an error) - {len(missing)} config keys have no comment on "
              f"their field, listed with an empty meaning in reference/config.md: "
              + ", ".join(missing), file=sys.stderr)
    for uri, content in pages.items():
        committed = files.get_file_from_path(uri)
        if committed is not None:  # the build shows a fresh generation, stale copy or not
            files.remove(committed)
        files.append(File.generated(config, uri, content=content))
    return files


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
