"""The init container of a job's pod: write the training contract's files (docs/workloads.md).

    python -m agents.kube.contract_files

The launcher hands the run file's content and the DeepSpeed configuration as JSON in `RUBICK_RUN_JSON` and
`RUBICK_DEEPSPEED_JSON`; this writes them to the paths the training processes are told
(`RUBICK_RUN_FILE`, `RUBICK_DEEPSPEED_CONFIG`), in the pod's shared emptyDir, and makes sure the
checkpoint folder exists. Exit status 2 and a one-line reason (the pod's termination message) when the
environment is not what the launcher sets.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

RUN_JSON = "RUBICK_RUN_JSON"
DEEPSPEED_JSON = "RUBICK_DEEPSPEED_JSON"
TERMINATION_LOG = "/dev/termination-log"


def write_files(env: dict[str, str]) -> list[Path]:
    """Write the run file and the DeepSpeed configuration; return their paths. ValueError when the
    environment lacks them or holds no JSON object."""
    from agents.contract import CHECKPOINT_DIR, DEEPSPEED_CONFIG, RUN_FILE

    written = []
    for content_var, path_var in ((RUN_JSON, RUN_FILE), (DEEPSPEED_JSON, DEEPSPEED_CONFIG)):
        raw, target = env.get(content_var), env.get(path_var)
        if not raw or not target:
            raise ValueError(f"{content_var} and {path_var} must both be set")
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"{content_var} is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ValueError(f"{content_var} is not a JSON object")
        path = Path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, path)
        written.append(path)
    if env.get(CHECKPOINT_DIR):
        Path(env[CHECKPOINT_DIR]).mkdir(parents=True, exist_ok=True)
    return written


def main(env: dict[str, str] | None = None) -> int:
    try:
        paths = write_files(dict(os.environ if env is None else env))
    except (ValueError, OSError) as exc:
        reason = f"contract files: {exc}"
        print(reason, file=sys.stderr)
        try:
            with open(TERMINATION_LOG, "w") as f:
                f.write(reason[:4000])
        except OSError:
            pass
        return 2
    print("contract files: " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
