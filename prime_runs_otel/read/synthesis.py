"""Episode records synthesised from another instrumentation's span tree.

Training and agent code is often traced already: by the OpenTelemetry GenAI
instrumentations (``gen_ai.*`` spans, messages in ``gen_ai.input.messages``),
by OpenInference (``llm.input_messages.*``) or by OpenLLMetry
(``gen_ai.prompt.*``, ``traceloop.*``). Such code only has to wrap each rollout
in an episode span with its rollout attributes (``prime.episode.example_id``,
the reward; see :func:`prime_runs_otel.episode_span`) for the
platform to get whole episodes: the record verifiers would have written is
rebuilt here from the spans under the episode span. Model calls become the
record's calls and its message graph, agent spans its traces, span status its
errors, and the episode's attributes and ``gen_ai.evaluation.result`` events
its rewards.

This module is the builder only: what one span says of failure and score is
read in :mod:`.synthesis_scores`, a trace's message graph and token totals
are counted in :mod:`.synthesis_graph`, each family's attribute names are
read in :mod:`prime_runs_otel.read.dialects`, and the spans wait for their episode in
:class:`~prime_runs_otel.read.span_tree.SpanTreeBuffer`. The record is shaped
so that verifiers' ``WireEpisode`` validates it and every projection in
:mod:`prime_runs_otel.read.projection` reads it like a native one; it is
checked like one read off a span
(:func:`~prime_runs_otel.read.checks.read_synthesized`) before the spool
takes it.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import semconv as sc
from .checks import derived_episode_id, whole_number
from .checks import text_or_none as _text
from .dialects.calls import DEFAULT_AGENT, agent_name, exchange, is_model_call
from .records import RunIdentity
from .spans import SpanView
from .synthesis_graph import MessageGraph, ModelCall, episode_tokens, trace_timing, trace_tokens
from .synthesis_scores import Scores, span_error

__all__ = ["synthesize_record"]

_EMPTY: Mapping[str, Any] = {}
_DEFAULT_TASK_TYPE = "Task"


# =====================================================================================
# The record
# =====================================================================================


@dataclass
class _Agent:
    """One trace to be: an agent span (or the episode itself) and its calls."""

    name: str
    view: SpanView
    trainable: bool
    calls: list[ModelCall] = field(default_factory=list)
    scores: Scores = field(default_factory=Scores)
    scored_views: list[SpanView] = field(default_factory=list)


def synthesize_record(
    root: SpanView, spans: Iterable[SpanView], identity: RunIdentity | None = None
) -> dict[str, Any]:
    """The episode record for ``root`` (an episode span without one) built from
    ``spans``, its descendants (any others are ignored).

    ``identity`` is the run the episode belongs to: it names the run block and
    the environment when the span does not.
    """
    tree = _Tree(root, spans)
    agents = tree.agents()
    task = _task(root, agents)
    root_error = _root_error(root)
    traces = [_trace(agent, task, tree, root_error) for agent in agents]
    summary_index = _summary_index(traces)
    summary = traces[summary_index] if traces else None
    if summary is not None:
        _apply_episode_outcome(summary, agents[summary_index], root)
    record: dict[str, Any] = {"id": _episode_id(root), "env": _env(root, identity), "task": task}
    group = _text(root.attributes.get(sc.EPISODE_GROUP))
    if group:
        record["group"] = {"id": group}
    run = _run_block(root, identity)
    if run is not None:
        record["run"] = run
    record["ok"] = _episode_ok(root, root_error, summary)
    record["is_timeout"] = False
    record["errors"] = [root_error] if root_error else list((summary or _EMPTY).get("errors", ()))
    record["traces"] = traces
    record.update(episode_tokens(traces))
    return record


def _root_error(root: SpanView) -> dict[str, Any] | None:
    if not _has_episode_error(root):
        return None
    return span_error(root, [(sc.EPISODE_ERROR_TYPE, sc.EPISODE_ERROR_MESSAGE)], failed=True)


def _has_episode_error(root: SpanView) -> bool:
    attributes = root.attributes
    return (
        root.status_error
        or attributes.get(sc.EPISODE_OK) is False
        or bool(_text(attributes.get(sc.EPISODE_ERROR_TYPE)))
        or any(event.name == "exception" for event in root.events)
    )


def _episode_ok(
    root: SpanView, root_error: dict[str, Any] | None, summary: Mapping[str, Any] | None
) -> bool:
    given = root.attributes.get(sc.EPISODE_OK)
    if isinstance(given, bool):
        return given
    return root_error is None and bool((summary or {"ok": True}).get("ok"))


class _Tree:
    """The descendants of an episode span, with the parent links between them."""

    def __init__(self, root: SpanView, spans: Iterable[SpanView]) -> None:
        self.root = root
        by_id = {view.span_id: view for view in spans if view.trace_id == root.trace_id}
        by_id.pop(root.span_id, None)
        children: dict[int, list[SpanView]] = {}
        for view in by_id.values():
            if view.parent_span_id is not None:
                children.setdefault(view.parent_span_id, []).append(view)
        # Down from the root, once: linear in the spans however deep the
        # tree, and parent links that loop never reach the root.
        self.members = []
        stack = list(children.get(root.span_id, ()))
        while stack:
            view = stack.pop()
            self.members.append(view)
            stack.extend(children.get(view.span_id, ()))
        self.members.sort(key=lambda view: (view.start_ns, view.end_ns))
        self.by_id = {view.span_id: view for view in self.members}
        self._owners: dict[int, _Agent] = {}

    def ancestors(self, view: SpanView) -> Iterable[SpanView]:
        """From the parent up to (and including) the root."""
        current = view.parent_span_id
        while current is not None and current in self.by_id:
            yield self.by_id[current]
            current = self.by_id[current].parent_span_id
        yield self.root

    def agents(self) -> list[_Agent]:
        """One agent per agent span, plus the episode itself for calls under no
        agent span, in the order they finished."""
        episode = _Agent(_episode_agent_name(self.root), self.root, _trainable(self.root))
        agents: dict[int, _Agent] = {}
        for view in self.members:
            name = agent_name(view)
            if name is not None:
                agents[view.span_id] = _Agent(name, view, _trainable(view))
        for view in self._innermost_calls():
            self._owner(view, agents, episode).calls.append(ModelCall(view, exchange(view)))
        for view in self.members:
            if view.span_id not in agents and any(
                event.name == sc.GEN_AI_EVALUATION_EVENT for event in view.events
            ):
                self._owner(view, agents, episode).scored_views.append(view)
        found = sorted(agents.values(), key=lambda agent: agent.view.end_ns)
        if episode.calls or not found:
            found.append(episode)
        for agent in found:
            if agent.view is not self.root:  # the root's own scores are the episode's
                agent.scores.read(agent.view, total_key=sc.AGENT_REWARD)
            for view in [call.view for call in agent.calls] + agent.scored_views:
                agent.scores.read_evaluations(view)
        return found

    def _owner(self, view: SpanView, agents: Mapping[int, _Agent], episode: _Agent) -> _Agent:
        """The innermost agent above ``view``; remembered per span on the way,
        so a deep chain of calls is walked once, not once per call."""
        walked: list[int] = []
        owner = episode
        for ancestor in self.ancestors(view):
            if ancestor.span_id in agents:
                owner = agents[ancestor.span_id]
                break
            if ancestor.span_id in self._owners:
                owner = self._owners[ancestor.span_id]
                break
            walked.append(ancestor.span_id)
        for span_id in walked:
            self._owners[span_id] = owner
        return owner

    def _innermost_calls(self) -> list[SpanView]:
        """Model-call spans, without one that wraps another (a framework span
        around the client library's span is the same call seen twice)."""
        calls = [view for view in self.members if is_model_call(view)]
        if is_model_call(self.root):
            calls.insert(0, self.root)
        wrapping: set[int] = set()
        for view in calls:
            if view is self.root:
                continue
            for ancestor in self.ancestors(view):
                if ancestor.span_id in wrapping:
                    break  # and so is everything above it: each chain is walked once
                wrapping.add(ancestor.span_id)
        return [view for view in calls if view.span_id not in wrapping]


def _episode_agent_name(root: SpanView) -> str:
    return _text(root.attributes.get(sc.GEN_AI_AGENT_NAME)) or DEFAULT_AGENT


def _trainable(view: SpanView) -> bool:
    value = view.attributes.get(sc.AGENT_TRAINABLE)
    return value if isinstance(value, bool) else True


def _episode_id(root: SpanView) -> str:
    return _text(root.attributes.get(sc.EPISODE_ID)) or derived_episode_id(root)


def _env(root: SpanView, identity: RunIdentity | None) -> dict[str, Any]:
    label = _text(root.attributes.get(sc.EPISODE_ENV))
    if label is None and identity is not None and identity.environments:
        label = identity.environments[0]
    return {"id": label, "name": label} if label else {"id": ""}


def _task(root: SpanView, agents: Sequence[_Agent]) -> dict[str, Any]:
    attributes = root.attributes
    idx = attributes.get(sc.EPISODE_EXAMPLE_ID)
    if isinstance(idx, str) and idx.lstrip("-").isdigit():
        idx = int(idx)  # OTLP/JSON and OTEL_RESOURCE_ATTRIBUTES carry ints as text
    data: dict[str, Any] = {"idx": idx}
    prompt = _first_user_text(agents)
    if prompt:
        data["prompt"] = prompt
    answer = _text(attributes.get(sc.EPISODE_ANSWER))
    if answer is not None:
        data["answer"] = answer
    return {"type": _text(attributes.get(sc.EPISODE_TASK_TYPE)) or _DEFAULT_TASK_TYPE, "data": data}


def _first_user_text(agents: Sequence[_Agent]) -> str | None:
    for agent in agents:
        for call in agent.calls:
            for message in call.exchange.inputs or ():
                if message.get("role") == "user" and isinstance(message.get("content"), str):
                    return str(message["content"])
    return None


def _run_block(root: SpanView, identity: RunIdentity | None) -> dict[str, Any] | None:
    """verifiers' run info. A training episode without a step has none (the
    run info of a training episode must say its work), which the uploader's
    stamping fills in from the span's step where it knows one."""
    if identity is None:
        return None
    step = whole_number(root.attributes.get(sc.RUN_STEP))
    run: dict[str, Any] = {"type": identity.kind, "id": identity.local_id}
    if identity.name:
        run["name"] = identity.name
    if identity.kind == "train":
        if step is None:
            return None
        run["work"] = {"type": "train", "step": step}
    return run


def _summary_index(traces: Sequence[Mapping[str, Any]]) -> int:
    for index, trace in enumerate(traces):
        if trace["agent"]["trainable"]:
            return index
    return 0


def _apply_episode_outcome(trace: dict[str, Any], agent: _Agent, root: SpanView) -> None:
    """The episode's own reward, scores and stop condition speak for its
    summary trace, over what the trace's agent span said."""
    episode = Scores()
    episode.read(root, total_key=sc.EPISODE_REWARD)
    if episode != Scores():
        scores = Scores(agent.scores.total, dict(agent.scores.named), dict(agent.scores.metrics))
        scores.merge(episode)
        trace["rewards"], trace["metrics"] = scores.rewards_and_metrics()
    stop = _text(root.attributes.get(sc.EPISODE_STOP_CONDITION))
    if stop:
        trace["stop_condition"] = stop


# -- one trace ------------------------------------------------------------------------------


def _trace(
    agent: _Agent,
    task: Mapping[str, Any],
    tree: _Tree,
    episode_error: dict[str, Any] | None,
) -> dict[str, Any]:
    graph = MessageGraph()
    calls = [graph.add(call) for call in sorted(agent.calls, key=lambda c: c.view.start_ns)]
    error = episode_error if agent.view is tree.root else span_error(agent.view)
    if error is None and agent.view is tree.root and _ends_in_failure(calls):
        error = calls[-1]["error"]
    errors = [error] if error else []
    rewards, metrics = agent.scores.rewards_and_metrics()
    stop = _text(agent.view.attributes.get(sc.AGENT_STOP_CONDITION))
    config: dict[str, Any] = {}
    model = next((call["model"] for call in calls if call.get("model")), None)
    if model:
        config["model"] = model
    sources = sorted({call.exchange.source for call in agent.calls})
    info: dict[str, Any] = {"otel_trace_id": f"{tree.root.trace_id:032x}"}
    if sources:
        info["instrumentation"] = sources
    trace: dict[str, Any] = {
        "version": 1,
        "id": _derived_id("trace", agent.view),
        "task": copy.deepcopy(task),
        "agent": {"config": config, "name": agent.name, "trainable": agent.trainable},
        "tools": graph.tools,
        "nodes": graph.nodes,
        "calls": calls,
        "mm_token_type_id_map": {},
        "request_rewrites": [],
        "response_rewrites": [],
        "rewards": rewards,
        "metrics": metrics,
        "info": info,
        "extra_usage": [],
        "is_completed": error is None,
        "ok": error is None,
        "is_timeout": False,
        "errors": errors,
        "timing": trace_timing(agent.view, calls),
    }
    if stop or error:
        trace["stop_condition"] = stop or "error"
    trace.update(trace_tokens(graph.nodes, calls))
    return trace


def _ends_in_failure(calls: Sequence[Mapping[str, Any]]) -> bool:
    """The last model call failed: nothing came after it to recover."""
    return bool(calls) and "error" in calls[-1]


def _derived_id(kind: str, view: SpanView) -> str:
    """A stable id for something the record needs and the spans do not name."""
    seed = f"{kind}:{view.trace_id:032x}:{view.span_id:016x}"
    return hashlib.sha256(seed.encode()).hexdigest()[:32]


# -- token totals, as verifiers computes them --------------------------------------------------
