"""What the RL loop samples and how each rollout is rewarded.

A workload turns one planned rollout (task, group, index, seed) into a finished rollout with a reward; the
model is reached only through a gateway session, so the trainer's samples come from the gateway journal
whatever the workload is.

- `TaskSetWorkload`: a task set, any environment (harnessrl.environments). Each rollout is the generate
  stage's `run_rollout` (the environment's episode: workspace and sandbox or none, the sample's harness spec,
  gateway session, what the agent produced) followed by the verify stage's `verify_rollout` (swe: fresh tree,
  tests, SWE-bench grading; others: the environment's reward) in the sandbox the spec names (podman,
  kubernetes: a fresh container / pod of the task's image; verify.rollouts.spec_sandbox); the reward is the
  one the sample's spec names.
- `PromptWorkload`: single-turn prompts with a verifiable answer word (JSONL rows `{task_id, prompt,
  answer}`); reward 1 when the reply contains the answer as a word. Small enough for tests and for the
  mode benchmark, where the tiny model can learn it.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from harnessrl.io import read_jsonl

if TYPE_CHECKING:
    from harnessrl.rollout.episode import RolloutRow
    from harnessrl.rollout.specs import NamedSpec
from harnessrl.schema import SCORED_STATUSES, RolloutStatus, SpecMix

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutPlan:
    rollout_id: str
    group_id: str
    task_id: str
    index: int  # k-th rollout of its group
    group_index: int  # position in the run's data order
    seed: int


@dataclass
class Finished:
    rollout_id: str
    group_id: str
    task_id: str
    reward: float | None
    status: RolloutStatus
    detail: str = ""
    wall_s: float = 0.0
    row: RolloutRow | None = None  # the episode's record, where the workload ran one (TaskSetWorkload)
    reward_parts: dict[str, float] = field(default_factory=dict)  # the environment's named components


@dataclass(frozen=True)
class GatewayAccess:
    url: str
    admin_token: str


class Workload(Protocol):
    def task_ids(self) -> list[str]: ...

    def run(self, plan: RolloutPlan, gateway: GatewayAccess) -> Finished: ...


def contains_word(reply: str, word: str) -> bool:
    return re.search(rf"\b{re.escape(word.lower())}\b", reply.lower()) is not None


class PromptWorkload:
    def __init__(self, path: str | Path, max_tokens: int = 64, temperature: float = 1.0):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(
                f"{self.path}: no prompt tasks file (JSONL rows {{task_id, prompt, answer}})"
            )
        self.tasks: dict[str, dict] = {}
        for lineno, row in enumerate(read_jsonl(self.path), 1):
            for key in ("task_id", "prompt", "answer"):
                if not isinstance(row.get(key), str) or not row[key]:
                    raise ValueError(f"{self.path}: row {lineno}: {key!r} must be a non-empty string")
            if row["task_id"] in self.tasks:
                raise ValueError(f"{self.path}: row {lineno}: duplicate task_id {row['task_id']!r}")
            self.tasks[row["task_id"]] = row
        if not self.tasks:
            raise ValueError(f"{self.path}: no tasks")
        self.max_tokens = max_tokens
        self.temperature = temperature

    def task_ids(self) -> list[str]:
        return list(self.tasks)

    def run(self, plan: RolloutPlan, gateway: GatewayAccess) -> Finished:
        from harnessrl.gateway import GatewayAdmin

        t0 = time.monotonic()
        task = self.tasks[plan.task_id]
        admin = GatewayAdmin(gateway.url, gateway.admin_token)
        session = admin.create_session(rollout_id=plan.rollout_id, group_id=plan.group_id)
        body = {
            "model": "policy",
            "messages": [{"role": "user", "content": task["prompt"]}],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "seed": plan.seed,
        }
        try:
            reply = chat(session.openai_base_url, session.api_key, body)
        except Exception as e:  # the rollout is kept with why; never a silent reward 0
            admin.end_session(session.session_id, "failed", str(e)[:500])
            return Finished(
                plan.rollout_id, plan.group_id, plan.task_id, None, RolloutStatus.INFRA_ERROR, str(e)[:500]
            )
        admin.end_session(session.session_id, "ok", None)
        reward = float(contains_word(reply, task["answer"]))
        return Finished(
            plan.rollout_id,
            plan.group_id,
            plan.task_id,
            reward,
            RolloutStatus.OK,
            wall_s=time.monotonic() - t0,
        )


def chat(base_url: str, api_key: str, body: dict[str, Any], timeout_s: float = 600.0) -> str:
    """One chat completion; a paused gateway (429) is waited out, so a weight sync is just a slow call."""
    data = json.dumps(body).encode()
    deadline = time.monotonic() + timeout_s
    while True:
        request = urllib.request.Request(
            f"{base_url}/chat/completions",
            data=data,
            headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                reply = json.loads(response.read())
            return str(reply["choices"][0]["message"].get("content") or "")
        except urllib.error.HTTPError as e:
            if e.code != 429 or time.monotonic() > deadline:
                raise RuntimeError(f"gateway answered {e.code}: {e.read()[:300]!r}") from None
            time.sleep(min(float(e.headers.get("Retry-After") or 1), 0.2))


class TaskSetWorkload:
    def __init__(
        self,
        tasks: str | Path,
        specs: list[NamedSpec] | str | Path | None = None,
        group_size: int = 4,
        *,
        allow_unsandboxed: bool = False,
        verify_timeout_s: float = 120.0,
        work: str | Path | None = None,
        environments: tuple[str, ...] = (),
        spec_mix: SpecMix = SpecMix.SAMPLE,
    ):
        """`environments`: train only on the task set's tasks of these environments (none: every task);
        `spec_mix`: several specs mixed inside each group (a task's rollouts take them round-robin, as the
        generate stage deals them) or dealt one per group by the group's position in the data order."""
        from harnessrl.environments.registry import environment_name
        from harnessrl.rollout.episode import Sandboxes, import_harnesses, spec_for
        from harnessrl.rollout.fit import check_run
        from harnessrl.rollout.specs import load_specs
        from harnessrl.taskset import TaskSet

        self.taskset = TaskSet.open(tasks)
        rows = self.taskset.rows()
        self.rows = {
            r["instance_id"]: r for r in rows if not environments or environment_name(r) in environments
        }
        if not self.rows:
            found = sorted({environment_name(r) for r in rows})
            raise ValueError(
                f"{self.taskset.tasks_path}: no tasks"
                + (
                    f" of environment(s) {', '.join(environments)} (it holds: {', '.join(found)})"
                    if rows
                    else ""
                )
            )
        self.sandboxes = Sandboxes(self.taskset, allow_unsandboxed)
        self.specs = specs if isinstance(specs, list) else load_specs(specs)
        self.position = {task_id: i for i, task_id in enumerate(self.rows)}  # spec assignment, as in generate
        self.group_size = group_size
        self.spec_mix = spec_mix
        self.verify_timeout_s = verify_timeout_s
        self.work = str(work) if work else None
        # every pairing the run will make, before its first rollout (one spec per group: any group position
        # may meet any task, so every spec is checked against it)
        if spec_mix is SpecMix.GROUP:
            picks = len(self.specs) or 1
            check_run(
                self.rows.values(), lambda task, i, k: spec_for(task, self.specs, k, 0, 1, spec_mix), picks
            )
        else:
            check_run(
                self.rows.values(),
                lambda task, i, k: spec_for(task, self.specs, i, k, group_size),
                group_size,
            )
        import_harnesses({s.spec.harness for s in self.specs})

    def task_ids(self) -> list[str]:
        return list(self.rows)

    def spec_of(self, plan: RolloutPlan) -> NamedSpec:
        from harnessrl.rollout.episode import spec_for

        position = plan.group_index if self.spec_mix is SpecMix.GROUP else self.position[plan.task_id]
        return spec_for(
            self.rows[plan.task_id], self.specs, position, plan.index, self.group_size, self.spec_mix
        )

    def run(self, plan: RolloutPlan, gateway: GatewayAccess) -> Finished:
        from harnessrl.rollout.episode import RolloutContext, plan_row, run_rollout
        from harnessrl.verify.grading import GRADED
        from harnessrl.verify.rollouts import spec_sandbox, verify_rollout

        t0 = time.monotonic()
        task = self.rows[plan.task_id]
        spec = self.spec_of(plan)
        row = plan_row(task, spec, plan.index, group_id=plan.group_id, rollout=plan.rollout_id)
        ctx = RolloutContext(self.sandboxes, gateway.url, gateway.admin_token, self.work)
        row = run_rollout(ctx, row, spec, task, plan.seed).row
        rollout = asdict(row)
        result = verify_rollout(  # graded where the spec ran it: podman / kubernetes in the task's image
            self.taskset, self.rows, rollout, Path("."), self.verify_timeout_s, None, spec_sandbox(spec.spec)
        )
        status = row.rollout_status
        reward: float | None = None
        if result.status in GRADED:  # patch_too_large too: scored 0 by verify (schema.SCORED_STATUSES)
            reward = result.reward  # verify scores with the rollout's reward_fn (the spec's `reward`)
        elif status in SCORED_STATUSES:  # the agent's rollout, but verifying it failed: ours
            status = RolloutStatus.INFRA_ERROR
        detail = row.error or result.detail
        return Finished(
            plan.rollout_id,
            plan.group_id,
            plan.task_id,
            reward,
            status,
            detail[:500],
            time.monotonic() - t0,
            row,
            dict(result.reward_parts) if result.status in GRADED else {},
        )
