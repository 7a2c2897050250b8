"""docs/events.md is generated from the schema; it must be regenerated whenever the schema changes."""

from __future__ import annotations

from pathlib import Path

from controlplane.events import SUBJECTS, decode, encode
from controlplane.events.docgen import example_event, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"


def test_events_md_is_up_to_date():
    assert DOC.read_text() == render(), \
        "docs/events.md is stale: run `python -m controlplane.events.docgen > docs/events.md`"


def test_every_worked_example_decodes():
    for subject in SUBJECTS:
        event = example_event(subject)
        assert decode(encode(event), subject) == event
        assert f"### {subject}" in DOC.read_text()
