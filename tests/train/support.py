"""Fixtures for the train tests: real tokenizer-made samples written as the gateway/verify would write them."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harnessrl.io import write_jsonl
from harnessrl.schema import Sample


def chat_ids(tokenizer, user: str, answer: str) -> tuple[list[int], list[int]]:
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": user}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    answer_ids = tokenizer(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
    return list(prompt), list(answer_ids)


def write_round(
    tmp: Path,
    tokenizer,
    *,
    groups: int = 3,
    per_group: int = 4,
    seed: int = 0,
    split_every: int = 3,
    failed: int = 1,
) -> tuple[Path, Path, list[Sample]]:
    """A round of rollouts: some split into 2 samples (a re-tokenized chain), `failed` non-ok rollouts."""
    rng = random.Random(seed)
    words = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "rocket"]
    samples: list[Sample] = []
    reward_rows = []
    k = 0
    for g in range(groups):
        for j in range(per_group):
            rid = f"g{g}-r{j}"
            word = words[(g + j) % len(words)]
            prompt, answer = chat_ids(tokenizer, f"Say the word {words[g]}.", f"The word is {word}" + "!" * j)
            ids = prompt + answer
            mask = [0] * len(prompt) + [1] * len(answer)
            beh = [0.0] * len(prompt) + [round(-rng.uniform(0.05, 2.0), 4) for _ in answer]
            parts = [(ids, mask, beh)]
            if k % split_every == 1:  # a second chain: follow-up turn after a rewritten history
                p2, a2 = chat_ids(tokenizer, "Again, shorter.", word)
                parts.append(
                    (
                        p2 + a2,
                        [0] * len(p2) + [1] * len(a2),
                        [0.0] * len(p2) + [round(-rng.uniform(0.05, 2.0), 4) for _ in a2],
                    )
                )
            for si, (i2, m2, b2) in enumerate(parts):
                samples.append(
                    Sample(
                        sample_id=f"{rid}-s{si}",
                        rollout_id=rid,
                        group_id=f"task-{g}",
                        input_ids=i2,
                        loss_mask=m2,
                        behavior_logprobs=b2,
                        policy_version=[0] * len(i2),
                    )
                )
            status = "timeout" if k < failed else "ok"
            reward_rows.append(
                {
                    "rollout_id": rid,
                    "reward": None if status != "ok" else float(word == words[g]),
                    "status": status,
                }
            )
            k += 1
    sp = tmp / "samples.parquet"
    pq.write_table(pa.Table.from_pylist([s.to_row() for s in samples]), sp)
    rp = tmp / "rewards.jsonl"
    write_jsonl(rp, reward_rows)
    return sp, rp, samples


def tiny_llama(seed: int = 0, vocab: int = 49152):
    """A 2-layer Llama with SmolLM2's vocabulary: the same architecture and code path, ~100× cheaper."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    return LlamaForCausalLM(cfg).float()


@pytest.fixture(scope="session")
def tiny_policy_dir(tmp_path_factory, tokenizer):
    """An HF model directory (tiny random Llama + the real SmolLM2 tokenizer) for stage/resume tests."""
    d = tmp_path_factory.mktemp("tiny-policy")
    tiny_llama().save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d
