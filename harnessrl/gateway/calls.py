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
    FinishReason,
    Generation,
    SamplingParams,
    generate_stream,
)

from .api_formats import CONTEXT_LENGTH_EXCEEDED, CONTEXT_MESSAGE
from .bodies import Offload
from .chains import CallPlan
from .config import GatewayConfig
from .enums import Api, ChainOp, Drift, NoticeKind, SessionStatus
from .errors import HTTPError
from .journal import Journal, shielded
from .messages import Msg, argument_defaults, same_actions, without_defaults
from .metrics import GatewayMetrics
from .params import CallParams
from .pause import PauseControl
from .records import CallRecord, CallTimings, NoticeRecord
from .render import ChatRenderer
from .sessions import Session, SessionStore
from .toolcalls import ToolCall

OnTokens = Callable[[list[int]], Awaitable[None]]
# The session is over (failed or ended): the Anthropic and OpenAI SDKs, and Claude Code's own retry loop,
# honour this header, so a harness stops instead of retrying 409 / 502 for minutes.
NO_RETRY = {"x-should-retry": "false"}


class CallSink(Protocol):
    """Where a streamed reply goes (streaming.SSEReply): told the call id first, then each engine step."""

    def begin(self, call_id: str, prompt_tokens: int) -> None: ...

    async def on_tokens(self, ids: list[int]) -> None: ...


@dataclass
class CallRequest:
    api: Api
    params: CallParams
    convert: Callable[[], tuple[list[Msg], list[dict[str, Any]]]]  # the request's messages and tools
    parse_cpu: float = 0.0  # decoding the JSON body
    large: bool = False  # converted, planned and drift-checked in a worker thread


@dataclass
class CallResult:
    call_id: str
    content: str
    tool_calls: list[ToolCall]
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int


@dataclass
class _Prepared:
    msgs: list[Msg]
    tools: list[dict[str, Any]]
    plan: CallPlan
    convert_cpu: float
    plan_cpu: float
    defaults: dict[str, dict[str, Any]]  # tool -> argument defaults (a call is judged on its action)


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
        offload: Offload,
    ) -> None:
        self.engine, self.renderer, self.config = engine, renderer, config
        self.journal, self.sessions, self.metrics, self.pause = journal, sessions, metrics, pause
        self.offload = offload

    def check_open(self, s: Session) -> None:
        if s.status is not SessionStatus.ACTIVE:
            raise HTTPError(
                409,
                "session_closed",
                f"session {s.session_id} is {s.status}" + (f": {s.reason}" if s.reason else ""),
                NO_RETRY,
            )
        if self.pause.paused:
            self.metrics.rejected_paused += 1
            raise HTTPError(
                429,
                "paused",
                "gateway paused for a weight update; retry later",
                {"Retry-After": str(self.config.retry_after_s)},
            )

    async def run(self, s: Session, req: CallRequest, sink: CallSink | None = None) -> CallResult:
        await self.pause.hold_while_paused()
        self.check_open(s)
        started = time.time()
        async with s.lock:  # the plan reserves a chain until this call is committed or fails
            prep = await self.offload.run(req.large, self._prepare, s, req)
        plan, params = prep.plan, req.params
        me = asyncio.current_task()
        assert me is not None
        self.pause.set_working(me, True)
        handed_over = False
        try:
            room = self._window(s) - len(plan.prompt_ids)
            if room < max(self.config.min_new_tokens, 1):
                return await self._context_exhausted(s, plan, sink, req.api)
            call_id = "c-" + uuid.uuid4().hex[:16]
            if sink is not None:
                sink.begin(call_id, len(plan.prompt_ids))
            t_engine = time.perf_counter()
            budget = min(params.max_tokens, room, s.reply_tokens or room)
            out = await self._generate(s, plan, params.sampling, budget, sink.on_tokens if sink else None)
            engine_s = time.perf_counter() - t_engine
            cpu0 = time.thread_time()
            text = self.renderer.completion_text(out.ids)
            if params.stops and any(x and x in text for x in params.stops):
                text = self._cut_at_stop(out, params.stops)
            content, calls = self.renderer.parse_completion(text)
            cpu_reply = time.thread_time() - cpu0
            drift, drift_cpu = await self.offload.run(
                req.large, self._drift_check, plan, prep.msgs, prep.tools
            )
            cpu1 = time.thread_time()
            sampled = [without_defaults(c, prep.defaults) for c in calls]  # hashed as the harness echoes it
            rec = self._record(s, plan, out, req.api, call_id, content, sampled, drift)
            t = rec.timings
            t.started_at, t.engine_s, t.drift_cpu_s = started, engine_s, drift_cpu
            # prompt building + record, without the sampled full re-render of the drift check (timed apart)
            t.gateway_cpu_s = prep.plan_cpu + cpu_reply + time.thread_time() - cpu1
            t.parse_cpu_s = req.parse_cpu + prep.convert_cpu  # JSON body + messages (O(request size))
            handed_over = True
            await shielded(self._commit(s, plan, rec))  # durable before the harness sees the reply
        finally:
            if not handed_over:
                await shielded(self._release(s, plan))
            self.pause.set_working(me, False)
        return CallResult(rec.call_id, content, calls, out.finish, t.prompt_tokens, len(out.ids))

    def _prepare(self, s: Session, req: CallRequest) -> _Prepared:
        cpu0 = time.thread_time()
        msgs, tools = req.convert()
        defaults = argument_defaults(tools)
        msgs = same_actions(msgs, defaults)
        cpu1 = time.thread_time()
        plan = s.chains.plan(msgs, tools)
        return _Prepared(msgs, tools, plan, cpu1 - cpu0, time.thread_time() - cpu1, defaults)

    async def _commit(self, s: Session, plan: CallPlan, rec: CallRecord) -> None:
        """Journal, then apply to the live chains: one step (run shielded), so what a restart rebuilds from
        the journal is what the live gateway holds, even when the client left during the fsync."""
        me = asyncio.current_task()
        assert me is not None
        self.pause.set_working(me, True)
        durable = False
        try:
            await self.journal.append(rec)
            durable = True
        finally:
            async with s.lock:
                if durable:
                    s.chains.commit(rec, plan)
                    s.calls += 1
                    self.metrics.count_call(
                        plan.op, rec.drift, plan.discarded_trainable, rec.timings.gateway_cpu_s
                    )
                s.chains.release(plan)
            self.pause.set_working(me, False)

    @staticmethod
    async def _release(s: Session, plan: CallPlan) -> None:
        async with s.lock:
            s.chains.release(plan)

    def _window(self, s: Session) -> int:
        """The session's context: the engine's, or the smaller window its spec gave it (`context_tokens`)."""
        return min(self.config.max_model_len, s.context_tokens or self.config.max_model_len)

    async def _context_exhausted(
        self, s: Session, plan: CallPlan, sink: CallSink | None, api: Api
    ) -> CallResult:
        """No room left for even `min_new_tokens`: answered without asking the engine — OpenAI chat: an empty
        reply with finish_reason "length"; Anthropic: the 400 its API gives (`prompt is too long: N tokens >
        M maximum`), which Claude Code reads as a full context (it ends or compacts; an empty reply cut for
        length made it ask to "resume" until it failed); Responses: error code `context_length_exceeded`
        (a 400, or a failed stream), which Codex reads as a full context window."""
        self.metrics.context_exhausted += 1
        n = len(plan.prompt_ids)
        await self.journal.append(NoticeRecord(s.session_id, NoticeKind.CONTEXT_EXHAUSTED, n, time.time()))
        limit = self._window(s) - max(self.config.min_new_tokens, 1)
        if api is Api.ANTHROPIC:
            raise HTTPError(400, "invalid_request_error", f"prompt is too long: {n} tokens > {limit} maximum")
        if api is Api.RESPONSES:  # a streamed call answers it as a failed stream (harness_api)
            message = f"{CONTEXT_MESSAGE} ({n} tokens > {limit} maximum)"
            raise HTTPError(400, "invalid_request_error", message, code=CONTEXT_LENGTH_EXCEEDED)
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
            except EngineRequestError as e:  # nothing was sampled: the session stays usable
                msg = f"the inference engine rejected the request: {e}"
                raise HTTPError(400, "invalid_request_error", msg) from None
            except EngineError as e:
                await self._fail(s, str(e))
                raise HTTPError(502, "engine_error", f"inference engine failed: {e}", NO_RETRY) from None
            except Exception as e:  # an engine bug is still an engine failure for the harness
                await self._fail(s, f"{type(e).__name__}: {e}")
                raise HTTPError(
                    502, "engine_error", f"inference engine failed: {type(e).__name__}: {e}", NO_RETRY
                ) from None
            finally:
                self.pause.untrack(request)
            out.ids += gen.token_ids
            out.logprobs += gen.logprobs
            out.versions += list(gen.token_policy_versions or [gen.policy_version] * len(gen.token_ids))
            finish = FinishReason(gen.finish_reason)
            if finish == FinishReason.ABORT:
                # an abort that lands on a finished generation (a stop token or the token budget sampled in
                # the step the pause came) ends it as it would have ended: it is never continued past its end
                if out.ids and out.ids[-1] in self.renderer.stop_token_ids:
                    finish = FinishReason.STOP
                elif len(out.ids) >= max_tokens:
                    finish = FinishReason.LENGTH
                else:
                    self.metrics.aborted_generations += 1
                    continue  # engine-side abort (weight sync): keep the partial tokens, continue after resume
            out.finish = finish
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
        out: _Sampled,
        api: Api,
        call_id: str,
        content: str,
        calls: list[ToolCall],
        drift: Drift | None,
    ) -> CallRecord:
        assistant = Msg("assistant", content, tuple(calls))
        return CallRecord(
            call_id=call_id,
            session_id=s.session_id,
            rollout_id=s.rollout_id,
            group_id=s.group_id,
            chain_id=plan.chain.chain_id,
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
            timings=CallTimings(prompt_tokens=len(plan.prompt_ids)),
        )

    def _drift_check(
        self, plan: CallPlan, msgs: list[Msg], tools: list[dict[str, Any]]
    ) -> tuple[Drift | None, float]:
        """Every `drift_check_every`-th call of a chain, a full re-render vs the exact-token prompt: clean
        (same ids), realigned (same text, other token boundaries), forked (other text). With its CPU time."""
        every = self.config.drift_check_every
        if not every or plan.op is ChainOp.NEW or plan.chain.calls % every:
            return None, 0.0
        cpu0 = time.thread_time()
        full = self.renderer.full_prompt(msgs, tools)
        if full == plan.prompt_ids:
            drift = Drift.CLEAN
        elif self.renderer.decode(full) == self.renderer.decode(plan.prompt_ids):
            drift = Drift.REALIGNED
        else:
            drift = Drift.FORKED
        return drift, time.thread_time() - cpu0
