"""`pip install` for `make setup`, with a few lines of progress instead of silence or noise.

    python scripts/pip_progress.py install -e '.[test,bench,docs]'

Runs `python -m pip <args> --progress-bar off` and prints what a person waiting wants to
know: how many packages are resolved so far (every 25), each large download with its size
(the wheels that take the time: torch, Ray, pyarrow...), when the unpacking starts and how
many packages it installed, and the total downloaded. pip's warnings and errors pass through
as they come; when pip fails, its last 40 lines follow, so the cause is on screen. A CI log
gets a few dozen lines, not pip's thousand.
"""
from __future__ import annotations

import collections
import re
import subprocess
import sys
import urllib.parse
from typing import Iterable, Iterator

BIG_MB = 10.0  # downloads at least this large get a line of their own
EVERY = 25  # a "resolved N packages" line every EVERY packages
TAIL = 40  # lines of pip's own output shown when it fails

_SIZE = re.compile(r"\(([\d.]+) (kB|MB|GB)\)\s*$")
_UNIT_MB = {"kB": 1e-3, "MB": 1.0, "GB": 1e3}


def _size_mb(line: str) -> float:
    m = _SIZE.search(line)
    return float(m.group(1)) * _UNIT_MB[m.group(2)] if m else 0.0


def summarise(lines: Iterable[str]) -> Iterator[str]:
    """The progress lines for pip's output `lines` (each without its newline)."""
    resolved = 0
    downloaded_mb = 0.0
    for raw in lines:
        line = raw.strip()
        if line.startswith(("Collecting ", "Requirement already satisfied: ")):
            resolved += 1
            if resolved % EVERY == 0:
                yield f"  resolved {resolved} packages..."
        elif line.startswith("Downloading ") and ".metadata " not in line:
            mb = _size_mb(line)
            downloaded_mb += mb
            if mb >= BIG_MB:
                name = urllib.parse.unquote(line.split()[1].rsplit("/", 1)[-1])  # URL or name
                yield f"  downloading {name} ({mb:,.0f} MB)"
        elif line.startswith("Installing collected packages: "):
            count = len(line.split(": ", 1)[1].split(", "))
            yield (f"  {resolved} packages resolved, {downloaded_mb:,.0f} MB downloaded; "
                   f"installing {count} of them (unpacking: a few minutes)")
        elif line.startswith("Successfully installed "):
            yield f"  installed {len(line.split()) - 2} packages"
        elif line.startswith(("ERROR", "WARNING", "error:")):
            yield raw


def main(args: list[str]) -> int:
    cmd = [sys.executable, "-m", "pip", *args, "--progress-bar", "off"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL)

    def lines() -> Iterator[str]:
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            yield tail[-1]

    for out in summarise(lines()):
        print(out, flush=True)
    rc = proc.wait()
    if rc != 0:
        print(f"pip failed (exit {rc}); its last {len(tail)} lines:", *tail, sep="\n",
              file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
