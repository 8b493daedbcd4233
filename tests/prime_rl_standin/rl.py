"""prime-rl's ``rl`` entry point (``src/prime_rl/entrypoints/rl.py``), as far as
reporting sees it: one launch id (``$PRL_RUN_ID``, set if unset) for every
process, then the trainer and the orchestrator started as child processes
with the launcher's environment, waited for, the first failure's exit code
passed on."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    os.environ.setdefault("PRL_RUN_ID", uuid.uuid4().hex)
    output_dir, *orchestrator_args = sys.argv[1:]
    steps = orchestrator_args[orchestrator_args.index("--max-steps") + 1]
    children = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "train.py"),
                "--output-dir",
                output_dir,
                "--max-steps",
                steps,
            ],
            env={**os.environ},
        ),
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "orchestrate.py"),
                "--output-dir",
                output_dir,
                *orchestrator_args,
            ],
            env={**os.environ},
        ),
    ]
    codes = [child.wait() for child in children]
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    sys.exit(main())
