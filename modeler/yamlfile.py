"""Reading the modeler's YAML files with errors that name the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""`yaml.safe_load`'s loader, in C where PyYAML was built with libyaml (the same documents, about 8 times faster:
every run and replay check reads the model specs and the environment)"""


def read_yaml(path: str | Path, error: type[Exception], what: str) -> Any:
    """The parsed document of `path`; `error` names the file when it cannot be read or parsed."""
    p = Path(path)
    try:
        return yaml.load(p.read_text(), Loader=LOADER)  # a safe loader
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise error(f"{p}: not valid YAML ({exc})") from None
