"""Sample assembly: the seed's "having" case, fork masking, selection, Parquet export (API and CLI)."""

from __future__ import annotations

import threading

import openai
import pandas as pd

from harnessrl.cli import main as cli_main
from harnessrl.engine.http_client import HTTPEngine
from harnessrl.gateway.records import CallRecord
from harnessrl.gateway.render import ChatRenderer
from harnessrl.gateway.samples import build_samples, call_rows
from harnessrl.schema import Sample
from tests.gateway.support import ADMIN, Messages, assistant_param, read_records


def _client(s):
    return openai.OpenAI(base_url=s.openai_base_url, api_key=s.api_key, max_retries=0)


def test_having_sampled_split_survives_into_the_sample(gateway, fast_engine, tokenizer):
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    enc = lambda t: tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
    sampled = enc("I am") + enc(" h") + enc("aving") + enc(" fun.") + [im_end]  # " h" + "aving"
    assert enc("I am having fun.") == enc("I am") + enc(" having") + enc(" fun.")  # re-tokenized: " having"
    engine = fast_engine([{"token_ids": sampled}, {"text": "Done."}])
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r-having", "task-having")
    msgs: Messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "How are you?"}]
    r1 = _client(s).chat.completions.create(model="p", messages=msgs)
    assert r1.choices[0].message.content == "I am having fun."
    msgs.append({"role": "assistant", "content": r1.choices[0].message.content})
    msgs.append({"role": "user", "content": "Bye"})
    _client(s).chat.completions.create(model="p", messages=msgs)

    recs = read_records(g.journal_dir)
    calls = [r for r in recs if isinstance(r, CallRecord)]
    assert [c.op for c in calls] == ["new", "extend"]
    assert calls[1].drift == "realigned"  # same text, other token boundaries than a re-render
    rows = call_rows(recs)
    renderer = ChatRenderer(tokenizer)
    from harnessrl.gateway.messages import from_openai

    rerendered = renderer.full_prompt(from_openai(msgs), [])
    assert enc(" having")[0] in rerendered  # what a re-tokenizing gateway would have trained on
    prompt2 = rows[1]["prompt_ids"]
    assert _contains(prompt2, sampled) and enc(" having")[0] not in prompt2
    [sample] = build_samples(recs)
    assert _contains(sample.input_ids, sampled)
    trained = [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
    assert trained[: len(sampled)] == sampled
    assert sample.group_id == "task-having" and sample.rollout_id == "r-having"


def _contains(seq: list[int], sub: list[int]) -> bool:
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_concurrent_continuations_fork_with_inherited_tokens_masked(gateway, fast_engine):
    engine = fast_engine(per_token_s=0.01)
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t")
    client = _client(s)
    msgs: Messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    r = client.chat.completions.create(model="p", messages=msgs)
    msgs.append(assistant_param(r.choices[0].message))
    msgs.append({"role": "user", "content": "next"})
    threads = [
        threading.Thread(target=client.chat.completions.create, kwargs={"model": "p", "messages": msgs})
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    recs = read_records(g.journal_dir)
    calls = [c for c in recs if isinstance(c, CallRecord)]
    assert sorted(c.op for c in calls[1:]) == ["extend", "fork"]
    fork = next(c for c in calls if c.op == "fork")
    assert fork.parent_chain_id == calls[0].chain_id
    samples = {x.sample_id.split("/")[1]: x for x in build_samples(recs)}
    forked = samples[fork.chain_id]
    n_inherited = len(fork.inherited_ids)
    assert n_inherited > len(calls[0].completion_ids)
    assert sum(forked.loss_mask[:n_inherited]) == 0  # trained once, in the parent chain
    assert sum(forked.loss_mask) == len(fork.completion_ids)
    longest = build_samples(recs, selection="longest")
    assert len(longest) == 1 and len(longest[0].input_ids) == max(len(x.input_ids) for x in samples.values())


def test_export_parquet_via_admin_and_cli(gateway, tmp_path, capsys):
    g, admin = gateway()
    sessions = [admin.create_session(f"r{i}", "g") for i in range(2)]
    for s in sessions:
        _client(s).chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}])
    out = admin.export(str(tmp_path / "exp"), rollout_id="r1")
    assert out["records"] == 1 and out["samples"] == 1
    df = pd.read_parquet(tmp_path / "exp" / "samples.parquet")
    sample = Sample.from_row(df.iloc[0].to_dict())
    assert sample.rollout_id == "r1" and len(sample.input_ids) == len(sample.loss_mask) > 0
    rec = pd.read_parquet(tmp_path / "exp" / "records.parquet").iloc[0]
    gen_prompt = g.renderer.generation_prompt_ids
    assert list(rec["prompt_ids"][-len(gen_prompt) :]) == gen_prompt
    # offline export straight from the journal, with the CLI
    assert (
        cli_main(["gateway", "export", "--journal", str(g.journal_dir), "--out", str(tmp_path / "cli")]) == 0
    )
    assert '"samples": 2' in capsys.readouterr().out
    assert len(pd.read_parquet(tmp_path / "cli" / "records.parquet")) == 2
    assert (
        cli_main(["gateway", "export", "--journal", str(tmp_path / "nope"), "--out", str(tmp_path / "x")])
        == 2
    )
    assert "no gateway journal here" in capsys.readouterr().err
    assert ADMIN
