"""Every span name and attribute key prime-runs-otel emits or reads, in one place.

Producer (``produce/``) and consumer (``read/``) both import from here, so
the two sides of the span contract cannot drift apart. The ``prime.*`` names
are defined once, as an OpenTelemetry Weaver registry in ``semconv/``;
``docs/semconv.md`` is the human-readable table of the same names, and
``tests/test_semconv_registry.py`` checks both against the registry.

Four kinds of telemetry make up a run:

* the **Resource** names the run: one ``TracerProvider`` per run, so every span
  of the run carries its identity without repeating it per span;
* a **run-start span** carries the run config once;
* one **episode span** per rollout carries the whole native record (the
  canonical form every platform projection is computed from) plus a few
  summary attributes for any OpenTelemetry backend to filter on, with agent
  and model-call child spans that follow the OpenTelemetry GenAI conventions so
  backends such as Jaeger, Tempo, Langfuse or Phoenix show the rollout;
* a **run-end span** carries the terminal status.

GenAI names are the ones of the OpenTelemetry GenAI semantic conventions
(``gen_ai.*``); everything specific to the Prime platform lives under
``prime.*``.
"""

from __future__ import annotations

import hashlib
from typing import Final

# --------------------------------------------------------------------------
# The instrumentation scope of every span, log record and metric the package
# makes. The schema URL is that of the semantic conventions release whose
# GenAI definitions they follow (v1.41.1, the last release of the GenAI
# conventions in the core repository, whose message JSON schemas the tests
# validate against).
# --------------------------------------------------------------------------

INSTRUMENTATION_SCOPE: Final = "prime_runs_otel"
SCHEMA_URL: Final = "https://opentelemetry.io/schemas/1.41.1"

# --------------------------------------------------------------------------
# Resource: the run. Read once per batch by the consumer; never patched later.
# --------------------------------------------------------------------------

SERVICE_NAME: Final = "service.name"
#: The producer process (standard OpenTelemetry): ``serve`` takes a run's end
#: only from the producer that owns the run (see ``RUN_OWNER``). A fresh
#: uuid4 per process unless the caller or ``OTEL_RESOURCE_ATTRIBUTES`` sets it.
SERVICE_INSTANCE_ID: Final = "service.instance.id"
#: Used when neither the caller nor ``OTEL_SERVICE_NAME`` names the service,
#: so backends do not file runs under the SDK's ``unknown_service``.
DEFAULT_SERVICE_NAME: Final = "prime-runs-otel"

#: The producer's own key for the run. Required: a span whose resource lacks
#: it belongs to no run and is ignored. Not the platform's id, which only
#: exists once the consumer has created the run.
RUN_ID: Final = "prime.run.id"
#: ``eval`` or ``train``: decides which platform API the run lives in.
RUN_KIND: Final = "prime.run.kind"
RUN_NAME: Final = "prime.run.name"
RUN_MODEL: Final = "prime.run.model"
#: String array of environment hub names or ``owner/name`` slugs.
RUN_ENVIRONMENTS: Final = "prime.run.environments"
RUN_FRAMEWORK: Final = "prime.run.framework"
#: The framework value of a run reported by the ``prime_rl`` instrumentation:
#: its run is closed with the request prime-rl's own monitor sends.
FRAMEWORK_PRIME_RL: Final = "prime-rl"
#: String array.
RUN_TAGS: Final = "prime.run.tags"
RUN_DESCRIPTION: Final = "prime.run.description"
#: Platform id of a run a launcher already created (a hosted eval's
#: ``$EVALUATION_ID``, a hosted training run's ``$RUN_ID``): the consumer
#: attaches instead of creating a second run.
RUN_ATTACH: Final = "prime.run.attach"
RUN_TEAM_ID: Final = "prime.run.team_id"

RUN_KINDS: Final = ("eval", "train")

#: Training runs only: what the run is registered with on the platform. Ints,
#: or their decimal strings (``OTEL_RESOURCE_ATTRIBUTES`` carries strings only).
#: ``max_steps`` 0 (or absent) says the length is unknown.
RUN_MAX_STEPS: Final = "prime.run.max_steps"
RUN_BATCH_SIZE: Final = "prime.run.batch_size"
RUN_ROLLOUTS_PER_EXAMPLE: Final = "prime.run.rollouts_per_example"
RUN_SEQ_LEN: Final = "prime.run.seq_len"
RUN_WANDB_PROJECT: Final = "prime.run.wandb_project"
RUN_WANDB_ENTITY: Final = "prime.run.wandb_entity"
RUN_WANDB_RUN_NAME: Final = "prime.run.wandb_run_name"

# --------------------------------------------------------------------------
# Run-start span: the config, sent once per run.
# --------------------------------------------------------------------------

RUN_START_SPAN: Final = "prime.run.start"
#: Blob (see below) holding the JSON of the platform metadata mapping: config
#: fields plus ``config_source`` when the run was started from a file.
RUN_CONFIG: Final = "prime.run.config"
#: ``false`` on the start span of a process that feeds a run somebody else
#: owns (``start_run(owns_run=False)``): it does not claim the run. Absent:
#: the sender owns the run, and only its ``service.instance.id`` may end it.
RUN_OWNER: Final = "prime.run.owner"
#: Where a config file lands inside the config mapping, byte for byte.
CONFIG_SOURCE_KEY: Final = "config_source"

# --------------------------------------------------------------------------
# Run-end span: the terminal status.
# --------------------------------------------------------------------------

RUN_END_SPAN: Final = "prime.run.end"
#: ``completed``, ``failed``, ``cancelled`` or ``crashed``.
RUN_STATUS: Final = "prime.run.status"
RUN_STATUSES: Final = ("completed", "failed", "cancelled", "crashed")
RUN_ERROR: Final = "prime.run.error"
#: How many episodes this producer recorded, so a consumer behind a collector
#: can wait for stragglers still in flight before finalizing the run.
RUN_EPISODES_RECORDED: Final = "prime.run.episodes_recorded"
#: The run summary the producer itself computed (a blob holding a JSON
#: object), sent instead of the one aggregated from the episodes. Callers of
#: prime-runs' ``Run.finish(summary)`` choose their run's summary; without
#: this attribute the summary is aggregated, as ``metrics.from_episodes``.
RUN_SUMMARY: Final = "prime.run.summary"

#: Episodes handed to the producer whose record could not be encoded (not in
#: ``episodes_recorded``): never sent, but counted on the run.
RUN_EPISODES_UNENCODABLE: Final = "prime.run.episodes_unencodable"

# --------------------------------------------------------------------------
# Metrics span: one training step's metrics (``Run.log_metrics``). A span
# rather than an OpenTelemetry metric because a step row is one event with a
# step and a timestamp, must be delivered exactly like an episode (durably,
# once per step), and any number of processes may report it. The numeric
# values also go out as OpenTelemetry metrics (``METRIC_STEP``) when the run
# has a MeterProvider, for dashboards.
# --------------------------------------------------------------------------

RUN_METRICS_SPAN: Final = "prime.run.metrics"
#: Blob holding the JSON object of metric values (finite numbers, strings,
#: bools; nested objects allowed), without ``step``.
RUN_METRICS_VALUES: Final = "prime.run.metrics.values"
#: Epoch seconds the values were logged at (the row's ``_timestamp``).
RUN_METRICS_TIMESTAMP: Final = "prime.run.metrics.timestamp"
#: ``True``: the row is posted exactly as logged, a post of its own (not
#: merged into its step's row), its keys in order, ``step`` as written (a
#: float stays a float), no ``_timestamp``. The values blob is then the whole
#: row. A property of the source: the ``prime_rl`` instrumentation sets it,
#: since prime-rl's own monitor posts every metrics dict so.
RUN_METRICS_VERBATIM: Final = "prime.run.metrics.verbatim"
# The step travels as RUN_STEP, the same attribute episodes carry.

# --------------------------------------------------------------------------
# Samples span: one Parquet object of a training step's sample table, as the
# producer wrote it (``prime_rl``: prime-rl's own table), so that ``serve``
# sends the same object as a process delivering in place. The step travels
# as RUN_STEP.
# --------------------------------------------------------------------------

RUN_SAMPLES_SPAN: Final = "prime.run.samples"
#: Blob holding the Parquet object as base64 text, its ``run_id`` column
#: empty (the platform's id is filled in when it is sent).
RUN_SAMPLES_PARQUET: Final = "prime.run.samples.parquet"

# --------------------------------------------------------------------------
# Episode span: one rollout. Identified by the presence of EPISODE_ID, not by
# its name, because the name embeds the environment.
# --------------------------------------------------------------------------

EPISODE_SPAN_PREFIX: Final = "episode"
EPISODE_ID: Final = "prime.episode.id"
#: ``task.data.idx`` of the summary trace (int or str): the platform numbers
#: rollouts per example with it.
EPISODE_EXAMPLE_ID: Final = "prime.episode.example_id"
EPISODE_ENV: Final = "prime.episode.env"
EPISODE_GROUP: Final = "prime.episode.group"
EPISODE_OK: Final = "prime.episode.ok"
#: Reward of the summary trace (first trainable trace, else the first): the
#: sum of score x weight over its scored rewards.
EPISODE_REWARD: Final = "prime.episode.reward"
EPISODE_STOP_CONDITION: Final = "prime.episode.stop_condition"
EPISODE_ERROR_COUNT: Final = "prime.episode.error.count"
EPISODE_ERROR_TYPE: Final = "prime.episode.error.type"
EPISODE_ERROR_MESSAGE: Final = "prime.episode.error.message"
#: The episode's token counts as verifiers keeps them (``num_input_tokens``,
#: ``num_output_tokens``). Not ``gen_ai.usage.*``: the model-call spans carry
#: usage, so a backend summing usage over a trace counts each token once.
EPISODE_INPUT_TOKENS: Final = "prime.episode.input_tokens"
EPISODE_OUTPUT_TOKENS: Final = "prime.episode.output_tokens"
#: Training step the episode was dispatched at (``run.work.step``), and the
#: step of a metrics span.
RUN_STEP: Final = "prime.run.step"
#: Blob holding the native episode record, the canonical form.
EPISODE_RECORD: Final = "prime.episode.record"
#: Set (``True``) instead of the record on an episode span whose record went
#: straight to the exporter of the process that made it: nobody else reads the
#: span, and the record is never joined, parsed and checked a second time.
EPISODE_RECORD_IN_PROCESS: Final = "prime.episode.record.in_process"

# --------------------------------------------------------------------------
# Episodes without a record: a span tree from another instrumentation
# (OpenTelemetry GenAI, OpenInference, OpenLLMetry) under an episode span.
#
# A span that carries EPISODE_EXAMPLE_ID but no EPISODE_RECORD is such an
# episode: its record is synthesised from its descendants (see
# ``prime_runs_otel.read.synthesis``). EPISODE_ID is optional there; without it
# the episode's id is derived from the span's trace and span ids, so a
# collector's duplicate is still the same episode. Rewards come from
# EPISODE_REWARD, AGENT_REWARD_PREFIX attributes and evaluation events.
# --------------------------------------------------------------------------

#: ``prime.agent.metric.{name}``: one named metric (a number), on the episode
#: span or an agent span.
AGENT_METRIC_PREFIX: Final = "prime.agent.metric."
#: The task's type name and reference answer, for the flat sample tables.
EPISODE_TASK_TYPE: Final = "prime.episode.task_type"
EPISODE_ANSWER: Final = "prime.episode.answer"

#: The GenAI conventions' evaluation event (a log record, or a span event),
#: read as a named reward score; emitted for each reward, in the episode
#: span's context.
GEN_AI_EVALUATION_EVENT: Final = "gen_ai.evaluation.result"
GEN_AI_EVALUATION_NAME: Final = "gen_ai.evaluation.name"
GEN_AI_EVALUATION_SCORE: Final = "gen_ai.evaluation.score.value"

# --------------------------------------------------------------------------
# Agent spans: one per trace, children of the episode span.
# --------------------------------------------------------------------------

AGENT_SPAN_PREFIX: Final = "invoke_agent"
AGENT_TRAINABLE: Final = "prime.agent.trainable"
#: Sum of score x weight over the trace's scored rewards.
AGENT_REWARD: Final = "prime.agent.reward"
#: ``prime.agent.reward.{name}``: one sub-reward's unweighted score.
AGENT_REWARD_PREFIX: Final = "prime.agent.reward."
#: Sub-reward attributes beyond this many are left out (the record keeps them
#: all) so an agent span stays below the SDK's default of 128 attributes,
#: which would otherwise silently evict the oldest ones.
MAX_SUB_REWARD_ATTRIBUTES: Final = 100
AGENT_STOP_CONDITION: Final = "prime.agent.stop_condition"
#: The trace id inside the record (not the OpenTelemetry trace id).
AGENT_TRACE_ID: Final = "prime.agent.trace_id"

# --------------------------------------------------------------------------
# OpenTelemetry GenAI semantic conventions (agent, model-call and tool spans,
# their events and metrics). Only what a record holds is set: a value the
# record does not have is left out, never guessed or copied from another.
# --------------------------------------------------------------------------

GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
OPERATION_INVOKE_AGENT: Final = "invoke_agent"
OPERATION_CHAT: Final = "chat"
OPERATION_TEXT_COMPLETION: Final = "text_completion"
OPERATION_EXECUTE_TOOL: Final = "execute_tool"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
#: The record's trace id: one agent's conversation (its message graph).
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
#: Read from other instrumentations' spans; never set here, since a record
#: keeps only the model requested.
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
#: Request parameters, from a call's ``sampling`` (an agent span: its
#: config's ``sampling``).
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P: Final = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K: Final = "gen_ai.request.top_k"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_SEED: Final = "gen_ai.request.seed"
GEN_AI_REQUEST_STOP_SEQUENCES: Final = "gen_ai.request.stop_sequences"
GEN_AI_REQUEST_FREQUENCY_PENALTY: Final = "gen_ai.request.frequency_penalty"
GEN_AI_REQUEST_PRESENCE_PENALTY: Final = "gen_ai.request.presence_penalty"
GEN_AI_REQUEST_CHOICE_COUNT: Final = "gen_ai.request.choice.count"
#: Input tokens including cache reads, as the conventions ask.
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_REASONING_OUTPUT_TOKENS: Final = "gen_ai.usage.reasoning.output_tokens"
#: JSON text in the conventions' message shape; only with content capture on.
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
#: The tools offered (the trace's ``tools``), only with content capture on.
GEN_AI_TOOL_DEFINITIONS: Final = "gen_ai.tool.definitions"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE: Final = "gen_ai.tool.type"
GEN_AI_TOOL_DESCRIPTION: Final = "gen_ai.tool.description"
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
ERROR_TYPE: Final = "error.type"
#: Required by the conventions on agent and model-call spans. A record names
#: no provider, but each call names the API path it went to (``endpoint``),
#: which says the API's flavour (``/chat/completions``: OpenAI's); an agent
#: config may name a ``provider`` outright. Without either it is left out.
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
#: The model server, from the agent config's ``client.base_url``.
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
#: The content-capture event of the conventions (``event_only`` and
#: ``span_and_event``): a log record through the Logs API, in the model-call
#: span's context, with the messages in structured form.
GEN_AI_INFERENCE_DETAILS_EVENT: Final = "gen_ai.client.inference.operation.details"

# The GenAI client metrics (a MeterProvider beside the run's TracerProvider).
GEN_AI_CLIENT_TOKEN_USAGE: Final = "gen_ai.client.token.usage"
GEN_AI_CLIENT_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
GEN_AI_TOKEN_TYPE: Final = "gen_ai.token.type"

# --------------------------------------------------------------------------
# The run's own metrics: step metrics and rewards, for dashboards. Defined in
# the registry beside the attributes (semconv/model/prime/metrics.yaml).
# --------------------------------------------------------------------------

#: Counter of episodes recorded, by environment and outcome.
METRIC_EPISODES: Final = "prime.run.episodes"
#: Histogram of episode rewards; exemplars point at episode spans.
METRIC_EPISODE_REWARD: Final = "prime.run.episode.reward"
#: Histogram of each reward's unweighted score, by ``prime.reward.name``.
METRIC_EPISODE_SCORE: Final = "prime.run.episode.score"
#: Gauge of each numeric step metric, by ``prime.metric.name``.
METRIC_STEP: Final = "prime.run.metric"
METRIC_NAME: Final = "prime.metric.name"
REWARD_NAME: Final = "prime.reward.name"

# --------------------------------------------------------------------------
# OpenInference (Arize Phoenix and the backends that read its conventions).
# Set on the episode, agent and model-call spans only when child spans are on:
# they exist for tracing backends, and the platform reads none of them.
# --------------------------------------------------------------------------

OPENINFERENCE_SPAN_KIND: Final = "openinference.span.kind"
OPENINFERENCE_CHAIN: Final = "CHAIN"
OPENINFERENCE_AGENT: Final = "AGENT"
OPENINFERENCE_LLM: Final = "LLM"
OPENINFERENCE_TOOL: Final = "TOOL"
#: The episode's first prompt and final completion (an agent's, for an agent
#: span; the call's messages as JSON, for a model call); only with content capture.
INPUT_VALUE: Final = "input.value"
INPUT_MIME_TYPE: Final = "input.mime_type"
OUTPUT_VALUE: Final = "output.value"
OUTPUT_MIME_TYPE: Final = "output.mime_type"
OPENINFERENCE_AGENT_NAME: Final = "agent.name"
LLM_MODEL_NAME: Final = "llm.model_name"
LLM_PROVIDER: Final = "llm.provider"
LLM_TOKEN_COUNT_PROMPT: Final = "llm.token_count.prompt"
LLM_TOKEN_COUNT_COMPLETION: Final = "llm.token_count.completion"
LLM_TOKEN_COUNT_TOTAL: Final = "llm.token_count.total"

#: The switch every GenAI instrumentation honours: prompts and completions can
#: hold personal or secret data, so they stay off spans unless asked for. The
#: episode record always carries them; this only governs the child spans.
CAPTURE_MESSAGE_CONTENT_ENV: Final = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
#: ``gen_ai_latest_experimental`` makes the GenAI utilities take only
#: ``span_only``, ``event_only``, ``span_and_event`` and ``no_content`` above.
SEMCONV_STABILITY_OPT_IN_ENV: Final = "OTEL_SEMCONV_STABILITY_OPT_IN"

# --------------------------------------------------------------------------
# Blob transport.
#
# The SDK evicts the oldest attribute past its count limit and, when a value
# length limit is set, truncates every string (each array element on its
# own). A blob therefore travels as a string array of chunks no longer than
# the effective length limit, with its UTF-8 byte length and SHA-256 beside
# it, so that truncation anywhere on the way is detected instead of yielding
# a silently corrupt record. Blob attributes are set last on their span so
# count-based eviction takes other attributes first.
# --------------------------------------------------------------------------

BLOB_SIZE_SUFFIX: Final = ".size"
BLOB_SHA256_SUFFIX: Final = ".sha256"
#: Chunk length (in characters) when no length limit is known: bounds the
#: size of any single protobuf string without splitting ordinary records.
DEFAULT_BLOB_CHUNK_CHARS: Final = 4 * 1024 * 1024

#: The SDK's own length-limit variables; the span-specific one wins in the SDK.
ATTRIBUTE_VALUE_LENGTH_LIMIT_ENV: Final = "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"
SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT_ENV: Final = "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT"


def blob_size_key(key: str) -> str:
    """The attribute holding a blob's UTF-8 byte length."""
    return key + BLOB_SIZE_SUFFIX


def blob_sha256_key(key: str) -> str:
    """The attribute holding a blob's SHA-256 hex digest."""
    return key + BLOB_SHA256_SUFFIX


def episode_span_name(env: str | None) -> str:
    """``episode {env}``: low-cardinality, and tells rollouts of different envs apart."""
    return f"{EPISODE_SPAN_PREFIX} {env}" if env else EPISODE_SPAN_PREFIX


def agent_span_name(agent: str | None) -> str:
    """``invoke_agent {name}``, the GenAI conventions' agent span name."""
    return f"{AGENT_SPAN_PREFIX} {agent}" if agent else AGENT_SPAN_PREFIX


def chat_span_name(model: str | None) -> str:
    """``chat {model}``, the GenAI conventions' inference span name."""
    return f"{OPERATION_CHAT} {model}" if model else OPERATION_CHAT


#: hashlib lets go of the GIL for inputs of this size and more.
_HASHLIB_GIL_MINSIZE = 2048
#: Up to this size a blob is hashed in slices that keep the GIL.
_HASH_IN_SLICES_UP_TO = 256 * 1024


def blob_sha256(data: bytes) -> str:
    """The hex SHA-256 pinned on a blob.

    hashlib releases the GIL for every input of 2 KiB or more, and taking it
    back can cost a whole switch interval (5 ms) while another thread
    computes: in a busy process that wait dwarfs the hashing of a few
    kilobytes. Most records are that small, so they are hashed in slices
    under the threshold; a large blob is hashed in one call, where letting
    other threads run is worth it.
    """
    if len(data) > _HASH_IN_SLICES_UP_TO:
        return hashlib.sha256(data).hexdigest()
    digest = hashlib.sha256()
    view = memoryview(data)
    step = _HASHLIB_GIL_MINSIZE - 1
    for offset in range(0, len(view), step):
        digest.update(view[offset : offset + step])
    return digest.hexdigest()
