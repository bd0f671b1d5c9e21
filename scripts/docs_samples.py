"""Sample output the guides show, generated from a run, not typed (`make docs-samples`).

A page shows a sample between two comment lines, the file's text in a fenced block:

    <!-- sample: docs/samples/quickstart-compare.txt (written by make docs-samples) -->
    ```text
    ...
    ```
    <!-- /sample -->

`python scripts/docs_samples.py` makes every file of SAMPLES from a run (the quickstart
as `make quickstart` runs it, with `--run-id qs`: finished steps are kept, so a second
call takes seconds) and rewrites each page's region from its file; `--pages` only rewrites
the regions from the files; `--check` says whether every region is its file's text (what
tests/test_docs.py runs). tests/test_quickstart.py checks a fresh quickstart against the
sample: the same rows, each WER inside the sample's 95 % CI.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AMFLOW = ROOT / ".venv" / "bin" / "amflow"
REGION = re.compile(r"^<!-- sample: (?P<file>\S+)[^\n]*-->\n```text\n(?P<body>.*?)^```\n"
                    r"<!-- /sample -->$", re.M | re.S)
OPENING = re.compile(r"^<!-- sample:", re.M)  # a region's first line (not a mention in prose)
QUICKSTART_RUN = "qs"


def _amflow(*args: str, root: Path, **kw) -> subprocess.CompletedProcess:
    """This checkout's amflow (its code first on the path, whatever the venv was installed
    from)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                     os.environ.get("PYTHONPATH")]))}
    return subprocess.run([str(AMFLOW), *args], cwd=root, env=env, check=True, **kw)


def quickstart_compare(root: Path = ROOT) -> str:
    """The quickstart's WER table as `amflow compare` prints it at the end of `make
    quickstart --run-id qs`, and a line saying how many test words and utterances."""
    _amflow("run", "ssl", "--config", "configs/tiny.yaml", "--run-id", QUICKSTART_RUN, root=root)
    runs = [f"{QUICKSTART_RUN}-teacher", f"{QUICKSTART_RUN}-ssl"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "compare.json"
        shown = _amflow("compare", *runs, "--config", "configs/tiny.yaml", "--out", str(out),
                        root=root, capture_output=True, text=True).stdout
        rows = json.loads(out.read_text())["rows"]
    # from its title to its footnote (the lines after it are the step's, for logs and XCom)
    table = shown[shown.index("# amflow compare:"):]
    table = table[:table.index("\n", table.index("\nn.s.:") + 1) + 1]
    test = json.loads((root / "data" / "quickstart" / "runs" / runs[0] / "decode-baseline" /
                       "result.json").read_text())
    return table + (f"\n({test['errors']['ref_words']} test words in {rows[0]['utterances']} "
                    "utterances)\n")


# file under the checkout -> what makes it
SAMPLES = {"docs/samples/quickstart-compare.txt": quickstart_compare}


def regions(text: str) -> list[re.Match]:
    return list(REGION.finditer(text))


def pages() -> list[Path]:
    return sorted(p for p in (ROOT / "docs").rglob("*.md") if OPENING.search(p.read_text()))


def stale_regions(root: Path = ROOT) -> list[str]:
    """Each page region whose text is not its file's (or whose file is missing)."""
    out = []
    for page in pages():
        text = page.read_text()
        if len(OPENING.findall(text)) != len(regions(text)):
            out.append(f"{page.relative_to(root)}: a sample region is not `<!-- sample: FILE "
                       "-->`, a ```text block, `<!-- /sample -->`")
        for m in regions(text):
            path = root / m["file"]
            if not path.exists() or path.read_text() != m["body"]:
                out.append(f"{page.relative_to(root)}: the sample {m['file']} differs from "
                           "its file: run `python scripts/docs_samples.py --pages`")
    return out


def _with_body(m: re.Match, body: str) -> str:
    whole, start = m.group(0), m.start()
    return whole[:m.start("body") - start] + body + whole[m.end("body") - start:]


def rewrite_pages(root: Path = ROOT) -> None:
    for page in pages():
        text = page.read_text()
        new = REGION.sub(lambda m: _with_body(m, (root / m["file"]).read_text()), text)
        if new != text:
            page.write_text(new)
            print(f"rewrote the samples of {page.relative_to(root)}")


def main(args: list[str]) -> int:
    if "--check" in args:
        stale = stale_regions()
        print("\n".join(stale), file=sys.stderr)
        return 1 if stale else 0
    if "--pages" not in args:
        for name, make in SAMPLES.items():
            (ROOT / name).parent.mkdir(parents=True, exist_ok=True)
            (ROOT / name).write_text(make())
            print(f"wrote {name}")
    rewrite_pages()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
