"""Fixtures: the real model specs, table and fitted parameters (fitted once per session), trace slices."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.config import load_parts

ROOT = Path(__file__).resolve().parents[2]
ARTIFACT = ROOT / "data" / "rubick-artifact"


@pytest.fixture(scope="session")
def parts(tmp_path_factory):
    return load_parts(cache_dir=tmp_path_factory.mktemp("fitcache"))


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, tmp_path_factory):
    """CLI runs cache fitted parameters under $XDG_CACHE_HOME: keep that out of the home folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg"))


def trace_slice(tmp_path: Path, name: str = "workload-base.csv", rows: int = 40, start: int = 0) -> Path:
    """The first `rows` jobs (after `start`) of an artifact trace, as a file of its own."""
    lines = (ARTIFACT / name).read_text().splitlines()
    out = tmp_path / f"slice-{name}"
    out.write_text("\n".join([lines[0], *lines[1 + start:1 + start + rows]]) + "\n")
    return out
