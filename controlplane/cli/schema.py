"""`rubick schema <subject>`: the JSON Schema of a message on a subject."""

from __future__ import annotations

import argparse
import json

from ..events import UnknownSubject, all_subjects, payload_type
from ..events.schema import object_schema
from .common import fail


def message_schema(subject: str) -> dict:
    cls, version = payload_type(subject)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"{subject} (schema version {version})",
        "description": "msgpack map; see docs/events.md for the encoding and the versioning rule",
        "type": "object",
        "additionalProperties": False,
        "required": ["v", "id", "subject", "time", "source", "data"],
        "properties": {
            "v": {"type": "integer", "minimum": 1, "maximum": version, "description": "schema version"},
            "id": {"type": "string", "minLength": 1, "maxLength": 128,
                   "description": "event id, unique; also the Nats-Msg-Id header"},
            "subject": {"type": "string", "const": subject, "description": "the subject published on"},
            "time": {"type": "number", "minimum": 0, "description": "event time [s since the Unix epoch]"},
            "source": {"type": "string", "maxLength": 128, "description": "who published it"},
            "data": object_schema(cls),
        },
    }


def register(sub) -> None:
    p = sub.add_parser("schema", help="print the JSON Schema of a subject's messages")
    p.add_argument("subject", nargs="?", help="e.g. job.submitted (omit with --list)")
    p.add_argument("--list", action="store_true", help="list the subjects")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.list or not args.subject:
        for s in all_subjects():
            print(s)
        return 0
    try:
        print(json.dumps(message_schema(args.subject), indent=2))
    except UnknownSubject:
        return fail(f"unknown subject {args.subject!r}; known: {', '.join(all_subjects())}")
    return 0
