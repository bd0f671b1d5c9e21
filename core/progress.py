"""Progress reporting that reads well both in a terminal and in an Airflow task log.

On a TTY it is a tqdm bar. Elsewhere (Airflow, Ray job logs, CI) it prints one line at
most every `interval_s` seconds: `[features] 12/40 shards (30%) 1.2 h audio, 480.0x RT, eta 31s`.
"""
from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    def __init__(self, total: int, desc: str, unit: str = "it", interval_s: float = 5.0,
                 stream=None):
        self.total = total
        self.desc = desc
        self.unit = unit
        self.done = 0
        self.interval_s = interval_s
        self.stream = stream or sys.stderr
        self.start = time.monotonic()
        self._last = 0.0
        self.postfix: dict[str, Any] = {}
        self._bar = None
        if getattr(self.stream, "isatty", lambda: False)():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream)

    def update(self, n: int = 1, **postfix: Any) -> None:
        self.done += n
        self.postfix.update(postfix)
        if self._bar is not None:
            self._bar.update(n)
            if postfix:
                self._bar.set_postfix({k: _fmt(v) for k, v in self.postfix.items()})
            return
        now = time.monotonic()
        if now - self._last >= self.interval_s or self.done >= self.total:
            self._last = now
            self._print()

    def _print(self) -> None:
        elapsed = time.monotonic() - self.start
        pct = 100.0 * self.done / self.total if self.total else 100.0
        eta = (elapsed / self.done * (self.total - self.done)) if self.done else float("nan")
        extra = " ".join(f"{k}={_fmt(v)}" for k, v in self.postfix.items())
        print(f"[{self.desc}] {self.done}/{self.total} {self.unit} ({pct:.0f}%) "
              f"elapsed {elapsed:.0f}s eta {eta:.0f}s {extra}".rstrip(),
              file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.done < self.total:
            self._print()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)
