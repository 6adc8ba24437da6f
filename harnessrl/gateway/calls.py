"""One model call: plan the prompt on a chain, generate (across pauses), cut at stop strings, build the call
record, journal it, commit it to the live chains."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from harnessrl.engine.base import (
    Engine,
    EngineError,
    EngineRequestError,
    Generation,
    SamplingParams,
    generate_stream,
)

from .chains import CallPlan
from .config import GatewayConfig
from .enums import Api, ChainOp, Drift, FinishReason, NoticeKind, SessionStatus
from .errors import HTTPError
from .journal import Journal
from .messages import Msg
from .metrics import GatewayMetrics
from .pause import PauseControl
from .records import CallRecord, CallTimings, NoticeRecord
from .render import ChatRenderer
from .sessions import Session, SessionStore
from .toolcalls import ToolCall

OnTokens = Callable[[list[int]], Awaitable[None]]


class CallSink(Protocol):
    """Where a streamed reply goes (streaming.SSEReply): told the call id first, then each engine step."""

    def begin(self, call_id: str, prompt_tokens: int) -> None: ...

    async def on_tokens(self, ids: list[int]) -> None: ...


@dataclass
class CallParams:
    """A harness request's generation settings, validated."""

    max_tokens: int
    sampling: SamplingParams
    stops: list[str]


@dataclass
class CallResult:
    call_id: str
    content: str
    tool_calls: list[ToolCall]
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int


@dataclass
class _Sampled:
    ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish: FinishReason


class CallRunner:
    def __init__(
        self,
        engine: Engine,
        renderer: ChatRenderer,
        config: GatewayConfig,
        journal: Journal,
        sessions: SessionStore,
        metrics: GatewayMetrics,
        pause: PauseControl,
    ) -> None:
        self.engine, self.renderer, self.config = engine, renderer, config
        self.journal, self.sessions, self.metrics, self.pause = journal, sessions, metrics, pause

    def check_open(self, s: Session) -> None:
        if s.status is not SessionStatus.ACTIVE:
            raise HTTPError(
                409,
                "session_closed",
                f"session {s.session_id} is {s.status}" + (f": {s.reason}" if s.reason else ""),
            )
        if self.pause.paused:
            self.metrics.rejected_paused += 1
            raise HTTPError(
                429,
                "paused",
                "gateway paused for a weight update; retry later",
                {"Retry-After": str(self.config.retry_after_s)},
            )

    async def run(
        self,
        s: Session,
        msgs: list[Msg],
        tools: list[dict[str, Any]],
        params: CallParams,
        api: Api,
        parse_cpu: float = 0.0,
        sink: CallSink | None = None,
    ) -> CallResult:
        self.check_open(s)
        started = time.time()
        cpu0 = time.thread_time()
        plan = s.chains.plan(msgs, tools)  # reserves the chain until this call is committed or fails
        cpu_plan = time.thread_time() - cpu0
        me = asyncio.current_task()
        assert me is not None
        self.pause.set_working(me, True)
        try:
            room = self.config.max_model_len - len(plan.prompt_ids)
            if room < max(self.config.min_new_tokens, 1):
                return await self._context_exhausted(s, plan, sink)
            call_id = "c-" + uuid.uuid4().hex[:16]
            if sink is not None:
                sink.begin(call_id, len(plan.prompt_ids))
            t_engine = time.perf_counter()
            out = await self._generate(
                s, plan, params.sampling, min(params.max_tokens, room), sink.on_tokens if sink else None
            )
            engine_s = time.perf_counter() - t_engine
            cpu1 = time.thread_time()
            text = self.renderer.completion_text(out.ids)
            if params.stops and any(x and x in text for x in params.stops):
                text = self._cut_at_stop(out, params.stops)
            rec, content, calls = self._record(s, plan, msgs, tools, out, api, call_id, text)
            t = rec.timings
            t.started_at, t.engine_s = started, engine_s
            # prompt building + record, without the sampled full re-render of the drift check (timed apart)
            t.gateway_cpu_s = cpu_plan + time.thread_time() - cpu1 - t.drift_cpu_s
            t.parse_cpu_s = parse_cpu
            await self.journal.append(rec)  # durable before the harness sees the reply
            s.chains.commit(rec, plan)
            s.calls += 1
            self.metrics.count_call(plan.op, rec.drift, plan.discarded_trainable, t.gateway_cpu_s)
        finally:
            s.chains.release(plan)
            self.pause.set_working(me, False)
        return CallResult(rec.call_id, content, calls, out.finish, t.prompt_tokens, len(out.ids))

    async def _context_exhausted(self, s: Session, plan: CallPlan, sink: CallSink | None) -> CallResult:
        """No room left for even `min_new_tokens`: answered "length" without asking the engine."""
        self.metrics.context_exhausted += 1
        n = len(plan.prompt_ids)
        await self.journal.append(NoticeRecord(s.session_id, NoticeKind.CONTEXT_EXHAUSTED, n, time.time()))
        call_id = "ctx-" + uuid.uuid4().hex[:12]
        if sink is not None:
            sink.begin(call_id, n)
        return CallResult(call_id, "", [], FinishReason.LENGTH, n, 0)

    async def _stream_into(
        self, prompt: list[int], sampling: SamplingParams, max_tokens: int, out: _Sampled, on_tokens: OnTokens
    ) -> Generation:
        """Consumes the engine's token stream into the call's lists (so tokens already shown to the harness
        survive a cancelling pause) and hands each step to `on_tokens`; returns an empty Generation holding
        the finish reason."""
        finish: str | None = None
        stop = self.renderer.stop_token_ids
        async for delta in generate_stream(self.engine, prompt, sampling, max_tokens, stop):
            out.ids += delta.token_ids
            out.logprobs += delta.logprobs
            out.versions += delta.token_policy_versions or [0] * len(delta.token_ids)
            if delta.token_ids:
                await on_tokens(out.ids)
            if delta.finish_reason is not None:
                finish = delta.finish_reason
                break
        if finish is None:
            raise EngineError("the engine's token stream ended without a finish_reason")
        return Generation(token_ids=[], logprobs=[], finish_reason=finish)

    async def _generate(
        self,
        s: Session,
        plan: CallPlan,
        sampling: SamplingParams,
        max_tokens: int,
        on_tokens: OnTokens | None,
    ) -> _Sampled:
        """Runs the engine; across an aborting pause it resumes with the tokens sampled so far. With
        `on_tokens` (a streamed reply) the engine streams and each step is handed over as it arrives."""
        out = _Sampled([], [], [], FinishReason.STOP)
        me = asyncio.current_task()
        assert me is not None
        while True:
            await self.pause.wait_resumed(me)
            prompt = plan.prompt_ids + out.ids if out.ids else plan.prompt_ids
            left = max_tokens - len(out.ids)
            if on_tokens is None:
                request = asyncio.ensure_future(
                    self.engine.generate(prompt, sampling, left, self.renderer.stop_token_ids)
                )
            else:
                request = asyncio.ensure_future(self._stream_into(prompt, sampling, left, out, on_tokens))
            self.pause.track(request)
            try:
                gen = await request
            except asyncio.CancelledError:
                if self.pause.untrack(request) and not me.cancelling():
                    continue  # aborted for a weight update: wait for resume, then generate again
                raise
            except EngineError as e:
                await self._fail(s, str(e))
                status = 400 if isinstance(e, EngineRequestError) else 502
                raise HTTPError(status, "engine_error", f"inference engine failed: {e}") from None
            except Exception as e:  # an engine bug is still an engine failure for the harness
                await self._fail(s, f"{type(e).__name__}: {e}")
                raise HTTPError(
                    502, "engine_error", f"inference engine failed: {type(e).__name__}: {e}"
                ) from None
            finally:
                self.pause.untrack(request)
            out.ids += gen.token_ids
            out.logprobs += gen.logprobs
            out.versions += list(gen.token_policy_versions or [gen.policy_version] * len(gen.token_ids))
            if gen.finish_reason == FinishReason.ABORT and len(out.ids) < max_tokens:
                self.metrics.aborted_generations += 1
                continue  # engine-side abort (weight sync): keep the partial tokens and continue after resume
            out.finish = FinishReason(gen.finish_reason)
            return out

    async def _fail(self, s: Session, reason: str) -> None:
        """An engine failure ends the rollout as failed (never trained as reward 0)."""
        self.metrics.calls_failed += 1
        await self.sessions.end(s, SessionStatus.FAILED, f"engine error: {reason}")

    def _cut_at_stop(self, out: _Sampled, stops: list[str]) -> str:
        """Stop strings: keep the sampled tokens up to the one that completes the first stop string (they
        were sampled and stay in the chain); the harness gets the text before the stop string."""
        ids = out.ids
        lo, hi = 1, len(ids)
        while lo < hi:  # shortest token prefix whose text contains a stop string
            mid = (lo + hi) // 2
            if any(x and x in self.renderer.decode(ids[:mid]) for x in stops):
                hi = mid
            else:
                lo = mid + 1
        shown = self.renderer.decode(ids[:lo])
        cut = min(shown.find(x) for x in stops if x and x in shown)
        out.ids, out.logprobs, out.versions = ids[:lo], out.logprobs[:lo], out.versions[:lo]
        out.finish = FinishReason.STOP
        return shown[:cut]

    def _record(
        self,
        s: Session,
        plan: CallPlan,
        msgs: list[Msg],
        tools: list[dict[str, Any]],
        out: _Sampled,
        api: Api,
        call_id: str,
        text: str,
    ) -> tuple[CallRecord, str, list[ToolCall]]:
        content, calls = self.renderer.parse_completion(text)
        assistant = Msg("assistant", content, tuple(calls))
        chain = plan.chain
        drift = None
        every = self.config.drift_check_every
        cpu0 = time.thread_time()
        if every and plan.op is not ChainOp.NEW and chain.calls % every == 0:
            drift = self._drift(plan, msgs, tools)
        drift_cpu = time.thread_time() - cpu0
        rec = CallRecord(
            call_id=call_id,
            session_id=s.session_id,
            rollout_id=s.rollout_id,
            group_id=s.group_id,
            chain_id=chain.chain_id,
            op=plan.op,
            parent_chain_id=plan.parent_chain_id,
            base_len=plan.base_len,
            base_nodes=plan.base_nodes,
            inherited_ids=plan.inherited_ids,
            inherited_nodes=plan.inherited_nodes,
            delta_ids=plan.delta_ids,
            new_nodes=plan.new_nodes,
            completion_ids=out.ids,
            completion_logprobs=out.logprobs,
            completion_versions=out.versions,
            close_ids=self.renderer.close_assistant(out.ids),
            assistant_cum=s.chains.hasher.extend(plan.prompt_cum, assistant),
            finish_reason=out.finish,
            discarded_trainable=plan.discarded_trainable,
            drift=drift,
            api=api,
            timings=CallTimings(prompt_tokens=len(plan.prompt_ids), drift_cpu_s=drift_cpu),
        )
        return rec, content, calls

    def _drift(self, plan: CallPlan, msgs: list[Msg], tools: list[dict[str, Any]]) -> Drift:
        """clean: a full re-render gives the same ids; realigned: same text, other token boundaries; forked: other text."""
        full = self.renderer.full_prompt(msgs, tools)
        if full == plan.prompt_ids:
            return Drift.CLEAN
        if self.renderer.decode(full) == self.renderer.decode(plan.prompt_ids):
            return Drift.REALIGNED
        return Drift.FORKED
