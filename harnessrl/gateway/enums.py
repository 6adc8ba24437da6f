"""Every status and mode of the gateway, defined once (journal values, API values and CLI choices).
Finish reasons are the engine's (`harnessrl.engine.base.FinishReason`)."""

from __future__ import annotations

from enum import StrEnum


class SessionStatus(StrEnum):
    ACTIVE = "active"
    ENDED = "ended"
    FAILED = "failed"


class EndStatus(StrEnum):
    """How a harness run ended, as the rollout reports it (`POST /admin/sessions/{sid}/end`)."""

    OK = "ok"
    FAILED = "failed"

    def session_status(self) -> SessionStatus:
        return SessionStatus.ENDED if self is EndStatus.OK else SessionStatus.FAILED


class ChainOp(StrEnum):
    """What a call did to its session's chains (see chains.py)."""

    NEW = "new"
    EXTEND = "extend"
    ROLLBACK = "rollback"
    FORK = "fork"


class Drift(StrEnum):
    """A full re-render vs the exact-token prompt: same ids, same text with other boundaries, other text."""

    CLEAN = "clean"
    REALIGNED = "realigned"
    FORKED = "forked"


class Selection(StrEnum):
    """Which chains of a rollout become samples."""

    ALL = "all"
    LONGEST = "longest"


class TrainChains(StrEnum):
    """Which chains of a session become training samples (a harness spec's `train_chains`)."""

    ALL = "all"  # every chain: the main agent, subagents, compaction, side calls
    MAIN = "main"  # only the chain its first call started (the main agent from the task prompt)


class PauseMode(StrEnum):
    FINISH = "finish"  # wait for in-flight calls
    ABORT = "abort"  # abort in-flight generations; they continue after resume


class Api(StrEnum):
    OPENAI = "openai"  # chat completions
    ANTHROPIC = "anthropic"
    RESPONSES = "responses"  # OpenAI Responses (Codex)


class NodeKind(StrEnum):
    SEED = "seed"
    MESSAGE = "message"
    ASSISTANT = "assistant"


class RecordType(StrEnum):
    SESSION = "session"
    SESSION_END = "session_end"
    CALL = "call"
    NOTICE = "notice"


class NoticeKind(StrEnum):
    CONTEXT_EXHAUSTED = "context_exhausted"
