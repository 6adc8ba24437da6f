"""Python helpers for the gateway's admin API (what the rollout stage calls). Blocking, stdlib only.

admin = GatewayAdmin(base_url, admin_token)
s = admin.create_session(rollout_id="r1", group_id="task-1")
# harness: OpenAI base URL s.openai_base_url, Anthropic base URL s.anthropic_base_url, key s.api_key
admin.end_session(s.session_id)                   # or status="failed", reason="..."
admin.export(out_dir, rollout_id="r1")            # records.parquet + samples.parquet
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from .enums import EndStatus, PauseMode, Selection, TrainChains


class GatewayClientError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"gateway answered HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    api_key: str
    base_url: str
    openai_base_url: str
    anthropic_base_url: str


def request_json(
    method: str, url: str, token: str | None = None, body: dict | None = None, timeout_s: float = 600.0
) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            msg = json.loads(raw)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            msg = raw.decode(errors="replace")[:500]
        raise GatewayClientError(e.code, msg) from None


# Session calls are bookkeeping the gateway answers at once. A gateway stopping as one arrives can leave its
# connection accepted but never read: a short timeout keeps the rollout thread that sent it (which the process
# joins at exit) from waiting out the 600 s meant for calls that wait on the engine.
ADMIN_CALL_TIMEOUT_S = 30.0


class GatewayAdmin:
    def __init__(self, base_url: str, admin_token: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = admin_token

    def _call(self, method: str, path: str, body: dict | None = None, timeout_s: float = 600.0) -> dict:
        return request_json(method, self.base_url + path, self.token, body, timeout_s)

    def create_session(
        self,
        rollout_id: str,
        group_id: str,
        train_chains: TrainChains | str = TrainChains.ALL,
        reply_tokens: int | None = None,
        context_tokens: int | None = None,
    ) -> SessionInfo:
        """`train_chains`: which of the session's chains become samples (`main`: only its first chain);
        `reply_tokens`: each of its calls samples at most this many tokens, whatever the call asks (the caller
        gets its API's ordinary length stop); `context_tokens`: its context window, below the engine's (a call
        whose prompt fills it gets its API's context-full answer, a reply is cut where it would overflow)."""
        body: dict[str, object] = {"rollout_id": rollout_id, "group_id": group_id}
        if TrainChains(train_chains) is not TrainChains.ALL:  # a gateway of before gets the body it knows
            body["train_chains"] = TrainChains(train_chains).value
        if reply_tokens is not None:
            body["reply_tokens"] = reply_tokens
        if context_tokens is not None:
            body["context_tokens"] = context_tokens
        d = self._call("POST", "/admin/sessions", body, ADMIN_CALL_TIMEOUT_S)
        return SessionInfo(
            d["session_id"], d["api_key"], d["base_url"], d["openai_base_url"], d["anthropic_base_url"]
        )

    def session(self, session_id: str) -> dict:
        return self._call("GET", f"/admin/sessions/{session_id}", None, ADMIN_CALL_TIMEOUT_S)

    def end_session(
        self, session_id: str, status: EndStatus | str = EndStatus.OK, reason: str | None = None
    ) -> dict:
        body = {"status": status, "reason": reason}
        return self._call("POST", f"/admin/sessions/{session_id}/end", body, ADMIN_CALL_TIMEOUT_S)

    def pause(
        self, mode: PauseMode | str = PauseMode.FINISH, timeout_s: float = 600.0, hold_new: bool = False
    ) -> dict:
        """`hold_new`: new calls wait until resume instead of getting 429 (harnesses see a slow call)."""
        body = {"mode": mode, "timeout_s": timeout_s, "hold_new": hold_new}
        return self._call("POST", "/admin/pause", body, timeout_s + 30)

    def resume(self) -> dict:
        return self._call("POST", "/admin/resume", {})

    def metrics(self) -> dict:
        return self._call("GET", "/admin/metrics")

    def export(
        self,
        out_dir: str,
        session_id: str | None = None,
        rollout_id: str | None = None,
        selection: Selection | str = Selection.ALL,
    ) -> dict:
        """Writes records.parquet and samples.parquet to out_dir on the gateway's file system."""
        return self._call(
            "POST",
            "/admin/export",
            {
                "out_dir": str(out_dir),
                "session_id": session_id,
                "rollout_id": rollout_id,
                "selection": selection,
            },
        )
