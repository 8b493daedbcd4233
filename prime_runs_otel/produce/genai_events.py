"""The GenAI events of an episode, as the conventions define them: log
records (the Logs API), each in the context of the span it is about.

* ``gen_ai.evaluation.result``, one per scored reward of each trace, in the
  episode span's context: the rewards as any GenAI-aware backend reads
  evaluation results.
* ``gen_ai.client.inference.operation.details``, one per model call when
  content capture asks for events (``event_only``, ``span_and_event``), in
  the model-call span's context, with the messages in structured form (the
  conventions ask for that on events).

They go to the run's LoggerProvider, which exists only when somebody asked
for one (``OTEL_LOGS_EXPORTER``, or ``start_run(logger_provider=...)``): no
provider, no events, and no cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry._logs import Logger, LoggerProvider, LogRecord, SeverityNumber
from opentelemetry.context import Context

from .. import __version__
from .. import semconv as sc
from ._fields import Attributes, as_mapping, as_number, put_str

__all__ = ["GenAIEvents"]

#: What the model-call span carries that its details event repeats.
_DETAIL_KEYS = frozenset(
    {
        sc.GEN_AI_OPERATION_NAME,
        sc.GEN_AI_PROVIDER_NAME,
        sc.GEN_AI_REQUEST_MODEL,
        sc.GEN_AI_CONVERSATION_ID,
        sc.GEN_AI_RESPONSE_FINISH_REASONS,
        sc.GEN_AI_USAGE_INPUT_TOKENS,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS,
        sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
        sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS,
        sc.GEN_AI_REQUEST_TEMPERATURE,
        sc.GEN_AI_REQUEST_TOP_P,
        sc.GEN_AI_REQUEST_TOP_K,
        sc.GEN_AI_REQUEST_MAX_TOKENS,
        sc.GEN_AI_REQUEST_SEED,
        sc.GEN_AI_REQUEST_STOP_SEQUENCES,
        sc.GEN_AI_REQUEST_FREQUENCY_PENALTY,
        sc.GEN_AI_REQUEST_PRESENCE_PENALTY,
        sc.GEN_AI_REQUEST_CHOICE_COUNT,
        sc.SERVER_ADDRESS,
        sc.SERVER_PORT,
        sc.ERROR_TYPE,
    }
)


class GenAIEvents:
    """Emits an episode's GenAI events on one Logs API logger."""

    def __init__(self, logger: Logger) -> None:
        self._logger = logger

    @classmethod
    def of(cls, provider: LoggerProvider) -> GenAIEvents:
        return cls(
            provider.get_logger(sc.INSTRUMENTATION_SCOPE, __version__, schema_url=sc.SCHEMA_URL)
        )

    def evaluation_results(self, context: Context, trace: Mapping[str, Any], when: int) -> None:
        """One ``gen_ai.evaluation.result`` per scored reward of ``trace``, in
        ``context`` (the episode span's), named after the reward, with its
        unweighted score; the trace is named by its conversation id."""
        rewards = as_mapping(trace.get("rewards"))
        if not rewards:
            return
        agent = as_mapping(trace.get("agent"))
        for name, reward in rewards.items():
            score = as_number(as_mapping(reward).get("score"))
            if score is None:
                continue
            attributes: Attributes = {
                sc.GEN_AI_EVALUATION_NAME: str(name),
                sc.GEN_AI_EVALUATION_SCORE: score,
            }
            put_str(attributes, sc.GEN_AI_CONVERSATION_ID, trace.get("id"))
            put_str(attributes, sc.GEN_AI_AGENT_NAME, agent.get("name"))
            self._logger.emit(
                LogRecord(
                    timestamp=when,
                    context=context,
                    event_name=sc.GEN_AI_EVALUATION_EVENT,
                    attributes=attributes,
                )
            )

    def inference_details(
        self,
        context: Context,
        span_attributes: Mapping[str, Any],
        messages: tuple[list[dict[str, Any]], list[dict[str, Any]]],
        tools: list[dict[str, Any]],
        when: int,
    ) -> None:
        """The model call's details, in ``context`` (its span's): what the
        span says of the call, and its messages and tools as structures."""
        attributes: Attributes = {
            key: value for key, value in span_attributes.items() if key in _DETAIL_KEYS
        }
        attributes[sc.GEN_AI_INPUT_MESSAGES] = messages[0]
        attributes[sc.GEN_AI_OUTPUT_MESSAGES] = messages[1]
        if tools:
            attributes[sc.GEN_AI_TOOL_DEFINITIONS] = tools
        self._logger.emit(
            LogRecord(
                timestamp=when,
                context=context,
                event_name=sc.GEN_AI_INFERENCE_DETAILS_EVENT,
                severity_number=SeverityNumber.DEBUG,
                attributes=attributes,
            )
        )
