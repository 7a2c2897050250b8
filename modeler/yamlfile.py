"""Reading the modeler's YAML files with errors that name the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from controlplane.models import SAFE_LOADER


def read_yaml(path: str | Path, error: type[Exception], what: str) -> Any:
    """The parsed document of `path`; `error` names the file when it cannot be read or parsed."""
    p = Path(path)
    try:
        return yaml.load(p.read_text(), Loader=SAFE_LOADER)  # a safe loader
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise error(f"{p}: not valid YAML ({exc})") from None
