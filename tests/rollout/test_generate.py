"""The generate stage end to end with a real gateway, real bubblewrap sandboxes, real harnesses and verify;
the model is the gateway's fast engine server (a real loopback token API replying from a script), so the
control flow and the pass path are deterministic. The real tiny model runs in test_real_model.py."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from harnessrl.io import read_jsonl
from harnessrl.rollout.generate import GenerateConfig, run_generate
from harnessrl.rollout.model_server import ModelSource
from harnessrl.rollout.specs import parse_specs
from harnessrl.taskset import TaskSet
from tests.support.fixtures import requires_bwrap


def single_line_fix(row: dict) -> tuple[str, str, str]:
    """(path, buggy line, fixed line) from a bug patch that changes exactly one line."""
    lines = row["patch"].splitlines()
    path = next(line[len("+++ b/") :] for line in lines if line.startswith("+++ b/"))
    minus = [line[1:] for line in lines if line.startswith("-") and not line.startswith("---")]
    plus = [line[1:] for line in lines if line.startswith("+") and not line.startswith("+++")]
    assert len(minus) == len(plus) == 1
    return path, plus[0].strip(), minus[0].strip()


def tool_call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def pick_task(taskset_dir: Path) -> dict:
    for row in TaskSet.open(taskset_dir).rows():
        try:
            single_line_fix(row)
            return row
        except AssertionError:
            continue
    raise AssertionError("the minirepo fixture must yield a task with a single-line fix")


@requires_bwrap
def test_generate_two_sandbox_settings_records_and_verify(synth_taskset, fast_engine, tokenizer, tmp_path):
    from harnessrl.verify.rollouts import run_verify

    row = pick_task(synth_taskset)
    path, buggy, fixed = single_line_fix(row)
    replies = [
        {
            "text": "Let me fix it.\n"
            + tool_call("str_replace_editor", command="str_replace", path=path, old_str=buggy, new_str=fixed)
        },
        {"text": tool_call("bash", command="git log --oneline | head -3; echo EXIT=$?")},
        {"text": tool_call("submit")},
    ]
    engine = fast_engine(replies)
    specs = parse_specs(
        [
            {"name": "react-bwrap", "harness": "react", "sandbox": "bubblewrap", "limits": {"turns": 5}},
            {
                "name": "react-strict",
                "harness": "react",
                "sandbox": "bubblewrap-strict",
                "limits": {"turns": 5, "memory_mb": 1024},
            },
        ]
    )
    out = tmp_path / "gen"
    metrics = run_generate(
        synth_taskset,
        out,
        specs,
        ModelSource(engine_url=engine.base_url),
        GenerateConfig(group_size=2, concurrency=2, instance_ids=[row["instance_id"]]),
    )
    rows = list(read_jsonl(out / "rollouts.jsonl"))
    assert [r["spec_name"] for r in rows] == ["react-bwrap", "react-strict"]
    for r in rows:
        assert (r["rollout_status"], r["finish_reason"], r["turns"], r["tool_calls"]) == (
            "ok",
            "submitted",
            3,
            3,
        )
        assert f"+{fixed}".replace(" ", "") in r["model_patch"].replace(" ", "")
        assert r["gateway"]["calls"] == 3 and r["gateway"]["splits"] == 0
    # (transcript: ..., git observation, submit call, submit observation)
    # the strict workspace has no repository: git refuses; the other one has exactly one commit
    obs = {
        r["spec_name"]: json.loads((out / "transcripts" / f"{r['rollout_id']}.json").read_text())[-3][
            "content"
        ]
        for r in rows
    }
    assert "git: disabled in this sandbox" in obs["react-strict"]
    assert "Initial commit" in obs["react-bwrap"] and "Bug Patch" not in obs["react-bwrap"]

    # every model call is in the gateway records with the exact sampled token ids
    records = pq.read_table(out / "records.parquet").to_pylist()
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    expected = [tokenizer.encode(r["text"], add_special_tokens=False) + [eot] for r in replies]
    for r in rows:
        calls = sorted(
            (c for c in records if c["rollout_id"] == r["rollout_id"]), key=lambda c: c["started_at"]
        )
        assert [c["completion_ids"] for c in calls] == expected
    samples = pq.read_table(out / "samples.parquet").to_pylist()
    assert sorted(s["rollout_id"] for s in samples) == sorted(r["rollout_id"] for r in rows)
    for s in samples:
        assert s["rollout_status"] == "ok" and sum(s["loss_mask"]) == sum(len(e) for e in expected)
    assert metrics["rollouts"] == 2 and metrics["status"] == {"ok": 2}
    report = (out / "report.md").read_text()
    assert "react-strict" in report and "data:image/png;base64," in report

    summary = run_verify(synth_taskset, out, tmp_path / "verified", workers=2)
    rewards = {r["rollout_id"]: r for r in read_jsonl(tmp_path / "verified" / "rewards.jsonl")}
    assert summary["resolved"] == 2 and all(r["reward"] == 1.0 for r in rewards.values())


@requires_bwrap
def test_cli_timed_out_rollout_is_kept_with_reason_and_its_samples_dropped(
    synth_taskset, fast_engine, tmp_path, capsys
):
    from harnessrl.cli import main

    row = pick_task(synth_taskset)
    engine = fast_engine([{"text": "thinking " * 40}], per_token_s=0.05)  # ~4 s per reply
    (tmp_path / "specs.json").write_text(
        json.dumps(
            [
                {"name": "slow", "harness": "react", "limits": {"turns": 5, "wall_s": 1.5}},
                {
                    "name": "budget",
                    "harness": "react",
                    "limits": {"turns": 1, "wall_s": 60},
                    "options": {"on_no_tool_call": "end"},
                },
            ]
        )
    )
    out = tmp_path / "gen"
    code = main(
        [
            "stage",
            "generate",
            "--tasks",
            str(synth_taskset),
            "--out",
            str(out),
            "--specs",
            str(tmp_path / "specs.json"),
            "--engine-url",
            engine.base_url,
            "--group-size",
            "2",
            "--instance-ids",
            row["instance_id"],
            "--failed-samples",
            "drop",
        ]
    )
    assert code == 0
    printed = json.loads(capsys.readouterr().out.splitlines()[0])
    assert printed["status"] == {"ok": 1, "timeout": 1}
    rows = {r["spec_name"]: r for r in read_jsonl(out / "rollouts.jsonl")}
    assert (rows["slow"]["rollout_status"], rows["slow"]["finish_reason"]) == ("timeout", "wall_time")
    assert "wall-clock" in rows["slow"]["error"]
    assert (rows["budget"]["rollout_status"], rows["budget"]["finish_reason"]) == ("ok", "no_tool_call")
    samples = pq.read_table(out / "samples.parquet").to_pylist()
    assert {s["rollout_id"] for s in samples} == {rows["budget"]["rollout_id"]}
    (tmp_path / "bad.json").write_text('[{"harness": "react", "sandbox": "docker"}]')
    code = main(
        [
            "stage",
            "generate",
            "--tasks",
            str(synth_taskset),
            "--out",
            str(tmp_path / "x"),
            "--specs",
            str(tmp_path / "bad.json"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "bad.json[0].sandbox must be one of bubblewrap" in err


def test_spec_validation_names_the_problem(tmp_path):
    with pytest.raises(
        ValueError, match=r"\[1\]\.harness must be one of react, .*claude-code.*, got 'aider'"
    ):
        parse_specs([{"harness": "react"}, {"harness": "aider"}])
    with pytest.raises(ValueError, match=r"\[0\]: unknown react harness option"):
        parse_specs([{"options": {"context_policy": "trim"}}])
    with pytest.raises(ValueError, match=r"limits: unknown key"):
        parse_specs({"limits": {"gpus": 1}})
    with pytest.raises(ValueError, match="unknown field"):
        parse_specs({"harnes": "react"})
    spec = parse_specs({"limits": {"turns": 3}})[0].spec
    assert spec.limits == {"turns": 3, "tokens": 8192, "wall_s": 600}


def test_unsandboxed_spec_refused_without_flag(synth_taskset, tmp_path):
    specs = parse_specs({"harness": "react", "sandbox": "local"})
    with pytest.raises(ValueError, match="--allow-unsandboxed"):
        run_generate(
            synth_taskset,
            tmp_path / "out",
            specs,
            ModelSource(engine_url="http://127.0.0.1:9"),
            GenerateConfig(group_size=1, max_tasks=1),
        )
    assert not (tmp_path / "out").exists()


def test_cli_unreachable_engine_is_infra_error_and_stdout_is_only_json(synth_taskset, tmp_path, capsys):
    """The gateway fails a session whose engine call failed (502, then 409 on a retry): the rollout is an
    infra_error whatever the harness made of it, and litellm's error banner stays out of stdout."""
    from harnessrl.cli import main

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    (tmp_path / "specs.json").write_text(
        json.dumps(
            [
                {"name": "react", "harness": "react", "sandbox": "local", "options": {"http_retries": 1}},
                {
                    "name": "mini",
                    "harness": "mini-swe-agent",
                    "sandbox": "local",
                    "options": {"model_retries": 1},
                },
            ]
        )
    )
    out = tmp_path / "gen"
    args = ["stage", "generate", "--tasks", str(synth_taskset), "--out", str(out), "--specs"]
    args += [str(tmp_path / "specs.json"), "--engine-url", dead, "--group-size", "2", "--max-tasks", "1"]
    assert main([*args, "--allow-unsandboxed"]) == 0
    printed = json.loads(capsys.readouterr().out)  # the whole of stdout is the JSON summary
    assert printed["status"] == {"infra_error": 2}
    for row in read_jsonl(out / "rollouts.jsonl"):
        assert (row["rollout_status"], row["finish_reason"]) == ("infra_error", "model_error"), row
        assert "engine" in row["error"], row["error"]
