from __future__ import annotations

from pathlib import Path

import pytest

from modeler.env import load_env
from modeler.spec import load_model

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "rubick-artifact"
MODELS = ROOT / "examples" / "models"
ENV_FILE = ROOT / "examples" / "envs" / "a800-8x8.yaml"
KEYS = ("vit", "roberta", "bert", "t5", "gpt2", "llama7", "llama30")


@pytest.fixture(scope="session")
def env():
    return load_env(ENV_FILE)


@pytest.fixture(scope="session")
def models():
    return {k: load_model(MODELS / f"{k}.yaml") for k in KEYS}
