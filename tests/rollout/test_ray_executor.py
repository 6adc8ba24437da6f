"""The Ray executor on a real local Ray cluster (LocalRayCluster(num_cpus=2): processes of its own, this
process its driver): the generate stage gives the same rollouts, records and samples as the thread executor,
and a worker process that dies mid-rollout leaves that rollout as an `infra_error` row with the reason while
the other rollouts finish. The model is the gateway's fast engine server (a real loopback token API replying
from a script), as in test_generate.py."""

from __future__ import annotations

import json
import re

import pyarrow.parquet as pq
import pytest

from harnessrl.io import read_jsonl
from harnessrl.rollout.executors import ExecutorName, make_executor
from harnessrl.rollout.generate import GenerateConfig, run_generate
from harnessrl.rollout.model_server import ModelSource
from harnessrl.rollout.ray_cluster import LocalRayCluster
from harnessrl.rollout.specs import parse_specs
from tests.rollout.test_generate import pick_task, single_line_fix, tool_call
from tests.support.fixtures import requires_bwrap

CALL_ID = re.compile(r"call_[0-9a-f]+")  # tool-call ids the gateway draws at random
# fields that differ between any two runs (timings, random session ids)
VOLATILE = {"session_id", "model_s", "tool_s", "harness_wall_s", "setup_s", "teardown_s", "wall_s", "gateway"}


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    with LocalRayCluster(num_cpus=2) as cluster:
        cluster.connect()
        yield ray


def stable(row: dict) -> dict:
    kept = {k: v for k, v in row.items() if k not in VOLATILE}
    kept["gateway_calls"] = row["gateway"]["calls"]
    return kept


def completions(out) -> dict[str, list]:
    by_rollout: dict[str, list] = {}
    for c in sorted(pq.read_table(out / "records.parquet").to_pylist(), key=lambda c: c["started_at"]):
        by_rollout.setdefault(c["rollout_id"], []).append(c["completion_ids"])
    return by_rollout


def samples(out) -> list[tuple]:
    return sorted(
        (s["rollout_id"], s["rollout_status"], tuple(s["loss_mask"]))
        for s in pq.read_table(out / "samples.parquet").to_pylist()
    )


@requires_bwrap
def test_ray_executor_writes_the_same_outputs_as_threads(ray_local, synth_taskset, fast_engine, tmp_path):
    row = pick_task(synth_taskset)
    path, buggy, fixed = single_line_fix(row)
    server = fast_engine(
        [
            {
                "text": "Fixing.\n"
                + tool_call(
                    "str_replace_editor", command="str_replace", path=path, old_str=buggy, new_str=fixed
                )
            },
            {"text": tool_call("bash", command="git status --short")},
            {"text": tool_call("submit")},
        ]
    )
    specs = parse_specs(
        [
            {"name": "react-bwrap", "harness": "react", "sandbox": "bubblewrap", "limits": {"turns": 5}},
            {
                "name": "react-strict",
                "harness": "react",
                "sandbox": "bubblewrap-strict",
                "limits": {"turns": 5},
            },
        ]
    )
    outs = {}
    for executor in (ExecutorName.THREADS, ExecutorName.RAY):
        outs[executor] = tmp_path / executor
        metrics = run_generate(
            synth_taskset,
            outs[executor],
            specs,
            ModelSource(engine_url=server.base_url),
            GenerateConfig(group_size=2, concurrency=2, instance_ids=[row["instance_id"]], executor=executor),
        )
        assert metrics["executor"] == executor and metrics["status"] == {"ok": 2}

    threads, ray = (list(read_jsonl(outs[e] / "rollouts.jsonl")) for e in ("threads", "ray"))
    assert [stable(r) for r in ray] == [stable(r) for r in threads]
    assert all(f"+{fixed}".replace(" ", "") in r["model_patch"].replace(" ", "") for r in ray)
    assert completions(outs["ray"]) == completions(outs["threads"])
    assert len(completions(outs["ray"])) == 2
    assert samples(outs["ray"]) == samples(outs["threads"])
    names = {e: sorted(p.name for p in (outs[e] / "transcripts").iterdir()) for e in outs}
    assert names["ray"] == names["threads"] and len(names["ray"]) == 2
    for name in names["ray"]:
        ray_text, threads_text = ((outs[e] / "transcripts" / name).read_text() for e in ("ray", "threads"))
        assert CALL_ID.sub("call_ID", ray_text) == CALL_ID.sub("call_ID", threads_text)


def test_crashed_ray_worker_is_recorded_with_its_reason(
    ray_local, synth_taskset, fast_engine, tmp_path, capsys
):
    """Rollout r0's agent kills its own worker process (`kill -9 $PPID` from an unsandboxed shell): a real
    worker crash. r0 must come back as infra_error / worker_crashed, r1 must finish normally."""
    from harnessrl.cli import main

    row = pick_task(synth_taskset)
    server = fast_engine(
        [
            {"text": tool_call("bash", command='case "$PWD" in *__r0) kill -9 $PPID;; esac; echo alive')},
            {"text": tool_call("submit")},
        ]
    )
    (tmp_path / "spec.json").write_text(
        json.dumps({"harness": "react", "sandbox": "local", "limits": {"turns": 4}})
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
            str(tmp_path / "spec.json"),
            "--engine-url",
            server.base_url,
            "--group-size",
            "2",
            "--instance-ids",
            row["instance_id"],
            "--executor",
            "ray",
            "--allow-unsandboxed",
        ]
    )
    assert code == 0
    # (Ray's raylet also reports the dead worker on stdout)
    printed = json.loads(next(line for line in capsys.readouterr().out.splitlines() if line.startswith("{")))
    assert printed["status"] == {"infra_error": 1, "ok": 1}
    rows = {r["sample_index"]: r for r in read_jsonl(out / "rollouts.jsonl")}
    assert (rows[0]["rollout_status"], rows[0]["finish_reason"]) == ("infra_error", "worker_crashed")
    assert rows[0]["error"].startswith("WorkerCrashedError: The worker died")
    assert (out / "transcripts" / f"{rows[0]['rollout_id']}.traceback.txt").is_file()
    assert (rows[1]["rollout_status"], rows[1]["finish_reason"], rows[1]["turns"]) == ("ok", "submitted", 2)
    # the crashed rollout's model call is in the records, and its samples say it is not trainable as ok
    assert len(completions(out)[rows[0]["rollout_id"]]) == 1
    statuses = {rid: st for rid, st, _ in samples(out)}
    assert statuses.get(rows[0]["rollout_id"], "infra_error") == "infra_error"
    assert statuses[rows[1]["rollout_id"]] == "ok"

    with pytest.raises(ValueError, match="executor must be one of"):
        make_executor("dask", 2)
