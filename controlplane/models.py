"""The model types the cluster knows out of the box: the specs under examples/models."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

DEFAULT_MODELS_DIR = Path(__file__).resolve().parent.parent / "examples" / "models"
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""`yaml.safe_load`'s loader, in C where PyYAML was built with libyaml (the same documents, about 8 times faster:
every run and replay check reads the model specs and the environment; `modeler.yamlfile` reads with it too)"""


def models_dir() -> Path:
    return Path(os.environ.get("RUBICK_MODELS_DIR", DEFAULT_MODELS_DIR))


def builtin_model_types(directory: Path | None = None) -> list[str]:
    """Names of the model specs in `directory` (`name:` of each YAML file, else its stem)."""
    directory = directory or models_dir()
    names = set()
    if directory.is_dir():
        for path in sorted(directory.glob("*.y*ml")):
            try:
                doc = yaml.load(path.read_text(), Loader=SAFE_LOADER)  # a safe loader
            except yaml.YAMLError:
                continue
            name = doc.get("name") if isinstance(doc, dict) else None
            names.add(name if isinstance(name, str) else path.stem)
    return sorted(names)
