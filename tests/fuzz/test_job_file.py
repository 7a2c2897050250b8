"""The job-file loader under fuzzing: any file gives a job or `Invalid` naming why, nothing else."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import yaml
from hypothesis import given
from hypothesis import strategies as st

from controlplane.client import load_job
from controlplane.events import Invalid

from .strategies import SPECIAL_FLOATS, VALUES, fuzz

REPO = Path(__file__).resolve().parents[2]
JOBS = sorted((REPO / "examples" / "jobs").rglob("*.yaml"))
YAML_BITS = st.sampled_from(["job_id: ", "plan:\n  dp: ", "\n", ": ", "- ", "&a ", "*a", "!!python/object ", "{", "}",
                             "[", "]", "'", '"', "\t", ".inf", "-.nan", "1e999", "0x10", "~", "? ", "---", "...",
                             "!!binary AAAA", "<<: *a", "%YAML 1.1\n", "\x00", "\ufeff"])


def _load(text: str | bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "job.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
        try:
            load_job(path)
        except Invalid as exc:
            assert str(exc)


@fuzz(150)
@given(st.lists(st.one_of(YAML_BITS, st.text(max_size=8)), max_size=20))
def test_any_yaml_like_text(parts):
    _load("".join(parts))


@fuzz(100)
@given(st.binary(max_size=200))
def test_any_bytes(data):
    _load(data)


@fuzz(200)
@given(st.sampled_from(JOBS), st.data())
def test_example_jobs_with_a_field_changed(path, data):
    doc = yaml.safe_load(path.read_text())
    target = doc
    keys = [k for k in doc]
    key = data.draw(st.sampled_from(keys))
    if isinstance(doc[key], dict) and doc[key] and data.draw(st.booleans()):
        target, key = doc[key], data.draw(st.sampled_from(sorted(doc[key])))
    target[key] = data.draw(st.one_of(SPECIAL_FLOATS, VALUES.filter(lambda v: not isinstance(v, bytes))))
    as_json = data.draw(st.booleans())
    try:
        text = json.dumps(doc) if as_json else yaml.safe_dump(doc, allow_unicode=True)
    except (TypeError, ValueError, yaml.YAMLError):
        return  # a value the format cannot write is no file
    _load(text)


def test_deep_nesting_is_invalid():
    for text in ("[" * 5000, "{a: " * 3000, "plan: " + "[" * 5000, "- " * 3000):
        _load(text)


def test_a_missing_file_is_invalid(tmp_path):
    try:
        load_job(tmp_path / "nope.yaml")
    except Invalid as exc:
        assert "no such file" in str(exc)
    else:
        raise AssertionError("no error")
