"""What a replay takes from a recorded eval: the run key the file's bytes
give, and the model, environment, name and config the eval recorded beside it.

Below both replays (in process, :mod:`.replay`; over OTLP,
:mod:`.otlp_replay`) so the same file becomes the same run whichever way it
is sent, and neither replay imports the other.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: The framework a replayed file comes from unless ``--framework`` says otherwise.
DEFAULT_FRAMEWORK = "verifiers"


def replay_run_key(path: Path, options: Mapping[str, Any] | None = None) -> str:
    """The run key of a replayed file: the same bytes with the same options
    give the same run, wherever the file lies (a copy, a move, another
    machine), so replaying again adds nothing; the same file under another
    ``--name``, ``--model``, ``--environment`` or ``--framework`` is another
    run, not episodes silently added to the first one. Only the options given
    count (``None`` or empty: not given), so a replay without any keeps the
    key earlier releases gave it."""
    digest = hashlib.sha256(b"prime-runs-otel replay\0")
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    given = {name: value for name, value in (options or {}).items() if value}
    if given:
        digest.update(b"\0options\0" + json.dumps(given, sort_keys=True).encode())
    return digest.hexdigest()[:32]


def replay_options(
    name: str | None,
    model: str | None,
    environments: Sequence[str] | None,
    framework: str | None,
) -> dict[str, Any]:
    """The replay options that make a run of their own (see :func:`replay_run_key`):
    the framework only when it is not the default a replay assumes."""
    return {
        "name": name,
        "model": model,
        "environments": list(environments or []),
        "framework": framework if framework != DEFAULT_FRAMEWORK else None,
    }


def recorded_eval(folder: Path) -> dict[str, Any]:
    """What a verifiers eval recorded in its run folder: the model, the
    environment and the config it was launched with (``configs/``)."""
    found: dict[str, Any] = {}
    resolved_dir = folder / "configs" / "resolved"
    resolved = sorted(resolved_dir.glob("*.json")) if resolved_dir.is_dir() else []
    if resolved:
        try:
            config = json.loads(resolved[0].read_text(encoding="utf-8"))
        except (OSError, ValueError):
            config = None
        if isinstance(config, dict):
            if isinstance(config.get("model"), str) and config["model"]:
                found["model"] = config["model"]
            env = config.get("env")
            if isinstance(env, dict):
                taskset = env.get("taskset") if isinstance(env.get("taskset"), dict) else {}
                env_id = env.get("id") or (taskset or {}).get("id")
                if isinstance(env_id, str) and env_id:
                    found["environments"] = [env_id]
            run = config.get("run")
            if isinstance(run, dict) and isinstance(run.get("name"), str) and run["name"]:
                found["name"] = run["name"]
            found["config_file"] = resolved[0]
    launch = sorted((folder / "configs").glob("*.toml")) if (folder / "configs").is_dir() else []
    if launch:
        found["config_file"] = launch[0]  # the file as launched, kept byte for byte
    return found
