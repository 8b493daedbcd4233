"""prime-rl's ``PrimeMonitor`` (``src/prime_rl/monitors/prime.py``): the same
requests to the RFT API with httpx, fire-and-forget on the caller's loop, the
same Parquet sample table every 10th step, the same atexit ``failed``, the
same ``completed`` through the status when ``/finalize`` fails. Left out:
its log lines and ``prime_cli``'s config file (the key and team come from
``PRIME_API_KEY`` and ``PRIME_TEAM_ID`` only)."""

from __future__ import annotations

import asyncio
import atexit
import io
import json
import os
from collections.abc import Coroutine
from datetime import datetime, timezone
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
from verifiers.v1.utils.platform import build_samples

from prime_rl.configs.monitors import PrimeMonitorConfig
from prime_rl.monitors.base import Kind, Monitor, Subset
from prime_rl.utils.config import BaseConfig
from prime_rl.utils.logger import get_logger
from prime_rl.utils.utils import sanitize

BASE_URL = "https://api.primeintellect.ai/api/v1/rft"

SAMPLE_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("step", pa.int64()),
        ("tag", pa.string()),
        ("problem_id", pa.int64()),
        ("sample_id", pa.int64()),
        ("prompt", pa.string()),
        ("completion", pa.string()),
        ("trajectory", pa.string()),
        ("answer", pa.string()),
        ("env_name", pa.string()),
        ("task", pa.string()),
        ("info", pa.string()),
        ("reward", pa.float64()),
        ("advantage", pa.float64()),
        ("metrics", pa.string()),
        ("timing", pa.string()),
        ("num_input_tokens", pa.int64()),
        ("num_output_tokens", pa.int64()),
        ("created_at", pa.timestamp("us", tz="UTC")),
    ]
)


class PrimeMonitor(Monitor):
    config: PrimeMonitorConfig

    async def init(self, config: BaseConfig | None = None) -> None:
        api_key = os.getenv("PRIME_API_KEY")
        if not api_key:
            raise RuntimeError("API key not found - set PRIME_API_KEY or run `prime login`")
        self.run = TrainRun(api_key)
        if run_id := os.getenv("RUN_ID"):
            self.run.id = run_id
            return
        fields: dict[str, Any] = {}
        if config is not None:
            fields = dict(
                base_model=config.model.name,
                max_steps=config.max_steps or 0,
                batch_size=config.batch_size,
                rollouts_per_example=config.group_size,
                seq_len=config.seq_len,
                environments=[env.env_id for env in config.train.source],
                run_config=config.model_dump(exclude_none=True, mode="json"),
                wandb_project=config.monitors.wandb.project if config.monitors.wandb else None,
            )
        await self.run.create(name=self.config.name, **fields)

    async def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        metrics, dropped = sanitize(metrics)
        if dropped:
            self.logger.warning(f"Dropping {len(dropped)} non-finite metric value(s)")
        self.run.submit("metrics upload", self.run.log_metrics(metrics))

    async def log_episodes(
        self, episodes: list[Any], step: int, kind: Kind, subset: Subset
    ) -> None:
        if kind != "train" or subset != "effective" or not episodes or step % 10 != 0:
            return

        async def upload() -> None:
            body = await asyncio.to_thread(episodes_to_parquet_bytes, episodes, self.run.id, step)
            if body is not None:
                await self.run.upload_samples(body, step)

        self.run.submit(f"episodes upload at step {step}", upload())

    async def finalize(self) -> None:
        await self.run.finalize()


class TrainRun:
    """The RFT run: create, metrics, samples, finalize; ``failed`` at exit
    unless finalized."""

    def __init__(self, api_key: str):
        self.id: str | None = None
        self.logger = get_logger()
        self._tasks: set[asyncio.Task[None]] = set()
        self.base_url = (os.getenv("PRIME_API_BASE") or BASE_URL).rstrip("/")
        self.headers = {
            "Authorization": f"Bearer {api_key}",
            "x-api-key": api_key,
            "Content-Type": "application/json",
        }
        self.client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=self.headers,
            timeout=30,
            transport=httpx.AsyncHTTPTransport(retries=3),
        )

    def submit(self, what: str, request: Coroutine[Any, Any, None]) -> None:
        async def guarded() -> None:
            try:
                await request
            except Exception as e:
                self.logger.warning(f"Failed {what}: {type(e).__name__}: {e}")

        task = asyncio.get_running_loop().create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def create(
        self,
        name: str | None = None,
        team_id: str | None = None,
        base_model: str = "unknown",
        max_steps: int = 0,
        batch_size: int | None = None,
        rollouts_per_example: int | None = None,
        seq_len: int | None = None,
        environments: list[str] | None = None,
        run_config: dict[str, Any] | None = None,
        wandb_project: str | None = None,
    ) -> str:
        team_id = team_id or os.getenv("PRIME_TEAM_ID")
        payload: dict[str, Any] = {"base_model": base_model, "max_steps": max_steps}
        optional = {
            "batch_size": batch_size,
            "rollouts_per_example": rollouts_per_example,
            "seq_len": seq_len,
            "environments": None
            if environments is None
            else [{"id": env_id} for env_id in environments],
            "run_config": run_config,
            "wandb_project": wandb_project,
        }
        payload.update((key, value) for key, value in optional.items() if value is not None)
        if name:
            payload["name"] = name
        if team_id:
            payload["team_id"] = team_id
        response = await self.client.post("/external-runs", json=payload)
        if response.status_code != 201:
            raise RuntimeError(
                f"Failed to create platform run (HTTP {response.status_code}): {response.text}"
            )
        self.id = response.json()["run"]["id"]
        self._owner_pid = os.getpid()
        atexit.register(self._mark_failed)
        return self.id

    async def log_metrics(self, metrics: dict[str, Any]) -> None:
        response = await self.client.post("/metrics", json={"run_id": self.id, "metrics": metrics})
        response.raise_for_status()

    async def upload_samples(self, parquet_bytes: bytes, step: int) -> None:
        presign = await self.client.post("/samples/presign", json={"run_id": self.id, "step": step})
        presign.raise_for_status()
        data = presign.json()["data"]
        async with httpx.AsyncClient(timeout=30) as client:
            put = await client.put(
                data["presignedUrl"],
                content=parquet_bytes,
                headers={"Content-Type": "application/parquet"},
            )
            put.raise_for_status()
        confirm = await self.client.post(
            "/samples/confirm", json={"run_id": self.id, "step": step, "s3_key": data["s3Key"]}
        )
        confirm.raise_for_status()

    async def finalize(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            response = await self.client.post("/finalize", json={"run_id": self.id, "summary": {}})
            response.raise_for_status()
        except httpx.HTTPError as e:
            self.logger.warning(f"Failed to finalize platform run {self.id}: {e}")
            await self.set_status(success=True)
        atexit.unregister(self._mark_failed)

    async def set_status(self, success: bool) -> None:
        status = "completed" if success else "failed"
        try:
            put = await self.client.put(f"/external-runs/{self.id}/status", json={"status": status})
            put.raise_for_status()
        except httpx.HTTPError as e:
            self.logger.warning(f"Failed to mark platform run {self.id} as {status}: {e}")

    def _mark_failed(self) -> None:
        if os.getpid() != self._owner_pid:
            return
        try:
            httpx.put(
                f"{self.base_url}/external-runs/{self.id}/status",
                headers=self.headers,
                json={"status": "failed"},
                timeout=30,
            ).raise_for_status()
        except httpx.HTTPError as e:
            self.logger.warning(f"Failed to mark platform run {self.id} as failed: {e}")


def episodes_to_parquet_bytes(episodes: list[Any], run_id: str | None, step: int) -> bytes | None:
    """One row per episode, from verifiers' ``build_samples`` plus the RFT columns."""
    advantages: dict[str, float | None] = {}
    env_names: dict[str, str] = {}
    for episode in episodes:
        summary = next((t for t in episode.traces if t.agent.trainable), episode.traces[0])
        advantages[episode.id] = summary.info.get("advantage")
        env_names[episode.id] = episode.env.id
    now = datetime.now(timezone.utc)
    rows = []
    for sample_id, sample in enumerate(build_samples(episodes)):
        trajectory = sample["trajectory"]
        if not trajectory:
            continue
        advantage = advantages.get(sample["episode_id"])
        trajectory = [{**branch, "advantage": advantage} for branch in trajectory]
        try:
            problem_id = (
                int(sample["example_id"]) if sample["example_id"] is not None else sample_id
            )
        except (TypeError, ValueError):
            problem_id = sample_id
        rows.append(
            {
                "run_id": run_id,
                "step": step,
                "tag": "",
                "problem_id": problem_id,
                "sample_id": sample_id,
                "prompt": "",
                "completion": json.dumps(sample["completion"]),
                "trajectory": json.dumps(trajectory),
                "answer": "",
                "env_name": env_names.get(sample["episode_id"], ""),
                "task": json.dumps(sample["task"]),
                "info": json.dumps(sample["info"]),
                "reward": sample["reward"],
                "advantage": advantage,
                "metrics": json.dumps(sample["metrics"]),
                "timing": json.dumps(sample["timing"]),
                "num_input_tokens": trajectory[-1]["num_input_tokens"],
                "num_output_tokens": trajectory[-1]["num_output_tokens"],
                "created_at": now,
            }
        )
    if not rows:
        return None
    table = pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA)
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="snappy", use_dictionary=True, write_statistics=True)
    return buffer.getvalue()
