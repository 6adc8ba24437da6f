"""Learning check: a few dozen GRPO steps on CPU raise the tiny model's held-out reward.

Task (verifiable, programmatic reward): "Reply with only the word 'X' and nothing else." — reward 1 if the
sampled reply contains the word X (case-insensitive), else 0. SmolLM2-135M-Instruct sampled at T=1 succeeds
on roughly a third of attempts, so groups are mixed and GRPO has signal. Training words and held-out
evaluation words are disjoint. Rollouts are sampled with plain `model.generate` (behavior logprobs from the
sampling distribution), trained through the train stage's own code (data.assemble → round.plan_round →
round.step_items → Trainer.step, rollout-level GRPO, rollout-token-mean loss).

    .venv/bin/python benchmarks/learning_check.py [--steps 20] [--threads 1] [--precision auto] [--smoke]

The trainer's compute format is `--precision` (default `auto`: bf16 where this host multiplies it faster than
fp32, `harnessrl.numformat`; the weights, the sampling model and AdamW's state stay fp32).
Last line: JSON with base/trained held-out mean reward and the precision the trainer ran in. `--smoke`: 2 steps of one group of 4, one held-out
sample per word, 1 torch thread unless `--threads` (seconds; the rewards mean nothing).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time

import torch

TRAIN_WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "tiger",
    "lemon",
    "piano",
    "rocket",
    "garden",
    "candle",
    "forest",
    "silver",
    "window",
    "orange",
    "planet",
    "bridge",
    "castle",
    "dragon",
    "pepper",
    "winter",
]
EVAL_WORDS = ["ocean", "pencil", "yellow", "button", "rabbit", "mirror", "summer", "basket"]


def prompt_text(word: str) -> str:
    return f"Reply with only the word '{word}' and nothing else."


def reward(reply: str, word: str) -> float:
    return float(re.search(rf"\b{re.escape(word)}\b", reply.lower()) is not None)


@torch.no_grad()
def sample(model, tok, words: list[str], n: int, max_new: int, seed: int):
    """n replies per word: (word, prompt_ids, reply_ids, reply_logprobs, text) rows."""
    tok.padding_side = "left"
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": prompt_text(w)}], add_generation_prompt=True, tokenize=False
        )
        for w in words
    ]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(seed)
    model.eval()
    out = model.generate(
        **enc,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=max_new,
        num_return_sequences=n,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
    )
    width = enc["input_ids"].shape[1]
    gen = out.sequences[:, width:]
    logps = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], dim=1)  # (B, T, V)
    chosen = logps.gather(-1, gen.unsqueeze(-1)).squeeze(-1)
    rows = []
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    for b in range(gen.shape[0]):
        wi = b // n
        prompt = [
            t
            for t, a in zip(enc["input_ids"][wi].tolist(), enc["attention_mask"][wi].tolist(), strict=True)
            if a
        ]
        ids, lps = [], []
        for t, lp in zip(gen[b].tolist(), chosen[b].tolist(), strict=True):
            ids.append(t)
            lps.append(lp)
            if t == eos or t == tok.eos_token_id:
                break
        rows.append((words[wi], prompt, ids, lps, tok.decode(ids, skip_special_tokens=True)))
    return rows


def evaluate(model, tok, n: int, max_new: int, seed: int) -> float:
    rows = sample(model, tok, EVAL_WORDS, n, max_new, seed)
    return sum(reward(text, w) for w, _, _, _, text in rows) / len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--words-per-step", type=int, default=2)
    ap.add_argument("--n", type=int, default=8, help="rollouts per prompt (group size)")
    ap.add_argument("--max-new", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--eval-n", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--precision", default="auto", help="trainer compute: auto | fp32 | bf16 (default auto)")
    ap.add_argument("--smoke", action="store_true", help="2 steps of one group of 4 (seconds)")
    args = ap.parse_args()
    if args.smoke:
        args.steps, args.words_per_step, args.n, args.eval_n = 2, 1, 4, 1
        args.threads = args.threads or 1  # one thread: a shared machine's other jobs cannot stall it
    if args.threads:
        torch.set_num_threads(args.threads)

    from harnessrl.schema import Sample
    from harnessrl.tinymodel import load_model, load_tokenizer
    from harnessrl.train.data import assemble
    from harnessrl.train.round import TrainConfig, plan_round, step_items
    from harnessrl.train.trainer import Trainer

    tok = load_tokenizer()
    model = load_model()
    cfg = TrainConfig.from_dict(
        {
            "train": {
                "seed": args.seed,
                "precision": args.precision,
                "optim": {"lr": args.lr, "max_grad_norm": 1.0},
            }
        }
    )
    trainer = Trainer(model, cfg.train)
    print(f"trainer precision: {trainer.precision} (asked: {args.precision})", flush=True)
    t0 = time.perf_counter()
    base = evaluate(model, tok, args.eval_n, args.max_new, seed=10_000)
    print(f"base held-out reward {base:.3f} ({time.perf_counter() - t0:.0f}s)", flush=True)
    rng = random.Random(args.seed)
    curve = []
    for step in range(args.steps):
        words = rng.sample(TRAIN_WORDS, args.words_per_step)
        rows = sample(model, tok, words, args.n, args.max_new, seed=args.seed * 7919 + step)
        samples = []
        for i, (w, prompt, ids, lps, text) in enumerate(rows):
            samples.append(
                Sample(
                    sample_id=f"{step}-{i}",
                    rollout_id=f"{step}-{i}",
                    group_id=f"{step}-{w}",
                    input_ids=prompt + ids,
                    loss_mask=[0] * len(prompt) + [1] * len(ids),
                    behavior_logprobs=[0.0] * len(prompt) + lps,
                    reward=reward(text, w),
                )
            )
        plan = plan_round(assemble(samples, None), cfg)
        mean_r = sum(s.reward for s in samples) / len(samples)
        if plan.steps:
            items, _ = step_items(plan, plan.steps[0], cfg)
            model.train()
            m = trainer.step(items)
        else:
            m = {"loss": float("nan")}
        curve.append(mean_r)
        print(
            f"step {step + 1}/{args.steps} train reward {mean_r:.3f} loss {m['loss']:.4f} "
            f"groups {plan.counts['groups_trained']} ({time.perf_counter() - t0:.0f}s)",
            flush=True,
        )
    trained = evaluate(model, tok, args.eval_n, args.max_new, seed=10_000)
    first = sum(curve[:5]) / max(len(curve[:5]), 1)
    last = sum(curve[-5:]) / max(len(curve[-5:]), 1)
    print(
        json.dumps(
            {
                "task": "reply-with-word",
                "steps": args.steps,
                "group_size": args.n,
                "heldout_reward_base": round(base, 4),
                "heldout_reward_trained": round(trained, 4),
                "heldout_gain": round(trained - base, 4),
                "train_reward_first5": round(first, 4),
                "train_reward_last5": round(last, 4),
                "eval_samples": args.eval_n * len(EVAL_WORDS),
                "seed": args.seed,
                "precision": str(trainer.precision),
                "precision_asked": args.precision,
                "wall_s": round(time.perf_counter() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
