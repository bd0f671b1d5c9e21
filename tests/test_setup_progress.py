"""`make setup`'s pip output (scripts/pip_progress.py): a few progress lines, never silence,
never pip's thousand lines; warnings and errors kept."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("pip_progress", ROOT / "scripts" / "pip_progress.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# pip 26's lines for a fresh install (shortened: 60 packages, two big wheels)
PIP_OUTPUT = (
    ["Obtaining file:///src/amflow", "  Installing build dependencies ... done"]
    + [line for i in range(60) for line in (
        f"Collecting pkg{i}==1.0 (from amflow==0.1.0)",
        f"  Downloading pkg{i}-1.0-py3-none-any.whl.metadata (2.1 kB)",
        f"  Downloading pkg{i}-1.0-py3-none-any.whl (150 kB)")]
    + ["Collecting torch==2.13.0", "  Downloading torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl (1.2 GB)",
       "Collecting ray==2.60.0", "  Downloading ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl (72.5 MB)",
       "Collecting onnx==1.23.0",
       "  Downloading https://mirror.example/simple/onnx/onnx-1.23.0%2Bcpu-cp311-x86_64.whl (20.0 MB)",
       "WARNING: the script foo is installed in '/x/bin' which is not on PATH.",
       "Installing collected packages: " + ", ".join(f"pkg{i}" for i in range(60)) + ", torch, ray",
       "Successfully installed " + " ".join(f"pkg{i}-1.0" for i in range(60)) + " torch-2.13.0 ray-2.60.0"]
)


def test_progress_names_the_big_downloads_and_the_phases_in_a_few_lines():
    out = list(_module().summarise(PIP_OUTPUT))
    assert out == [
        "  resolved 25 packages...",
        "  resolved 50 packages...",
        "  downloading torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl (1,200 MB)",
        "  downloading ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl (72 MB)",
        "  downloading onnx-1.23.0+cpu-cp311-x86_64.whl (20 MB)",
        "WARNING: the script foo is installed in '/x/bin' which is not on PATH.",
        "  63 packages resolved, 1,302 MB downloaded; installing 62 of them (unpacking: a few minutes)",
        "  installed 62 packages",
    ]


def test_a_failing_pip_shows_its_own_last_lines(capsys):
    module = _module()
    rc = module.main(["install", "--no-index", "--find-links", "/nonexistent", "no-such-package-xyz"])
    err = capsys.readouterr().err
    assert rc != 0
    assert "pip failed" in err and "no-such-package-xyz" in err
