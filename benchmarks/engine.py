"""Local engine throughput: 8 concurrent sessions through LocalEngine vs one-at-a-time `model.generate`.

Both sides use the same model weights, the same chat prompts, greedy decoding, the same stop tokens and the
same max_tokens, measured side by side in this run (baseline and engine alternate per repeat). Greedy
outputs are also compared token by token (the engine must produce what `generate` produces).

    .venv/bin/python benchmarks/engine.py [--sessions 8] [--max-tokens 64] [--repeats 1]

Last line: JSON with `batched_speedup`, `engine_tokens_per_s`, `generate_tokens_per_s`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

import torch

from harnessrl.logs import configure_logging
from harnessrl.progress import track

QUESTIONS = [
    "Explain in detail how a hash map works and when it is slow.",
    "Write a Python function that parses a CSV file and explain each line.",
    "Describe the water cycle step by step for a school report.",
    "What are the pros and cons of microservices? Give a long answer.",
    "Tell me a long story about a robot who learns to paint.",
    "Explain how git rebase differs from git merge, with examples.",
    "List ten tips for writing readable code and explain each one.",
    "Describe how a compiler turns source code into machine code.",
    "Explain recursion to a beginner with three examples.",
    "Why is the sky blue? Explain the physics thoroughly.",
    "Compare Python lists, tuples and sets in depth.",
    "Write a short essay about the history of the internet.",
    "Explain what unit tests are and how to write good ones.",
    "Describe how HTTP requests travel from a browser to a server.",
    "What is gradient descent? Explain it with an analogy.",
    "Explain how a bubble sort works and why it is slow.",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    configure_logging()

    from harnessrl.engine.base import SamplingParams
    from harnessrl.engine.local import LocalEngine
    from harnessrl.tinymodel import load_model, tiny_model_dir

    model_dir = tiny_model_dir()
    engine = LocalEngine(model_dir, max_batch=args.sessions)
    tokenizer = engine.tokenizer
    # Any: transformers types `generate`'s self as a protocol its own model classes do not satisfy
    baseline_model: Any = load_model(model_dir).eval()
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in (QUESTIONS * (1 + args.sessions // len(QUESTIONS)))[: args.sessions]
    ]
    stop = sorted(engine.default_stop)
    greedy = SamplingParams(temperature=0.0)
    print(
        f"model {model_dir.name}, {args.sessions} sessions x {args.max_tokens} max tokens, "
        f"torch threads {torch.get_num_threads()}",
        file=sys.stderr,
    )

    def run_baseline() -> tuple[float, list[list[int]]]:
        outputs = []
        start = time.perf_counter()
        with torch.inference_mode():
            for prompt in track(prompts, "model.generate one at a time"):
                ids = torch.tensor([prompt])
                out = baseline_model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=False,
                    max_new_tokens=args.max_tokens,
                    eos_token_id=stop,
                    pad_token_id=tokenizer.pad_token_id,
                )
                outputs.append(out[0, len(prompt) :].tolist())
        return time.perf_counter() - start, outputs

    async def run_engine() -> tuple[float, list[list[int]]]:
        start = time.perf_counter()
        gens = await asyncio.gather(*(engine.generate(p, greedy, args.max_tokens) for p in prompts))
        return time.perf_counter() - start, [g.token_ids for g in gens]

    base_rates, engine_rates, identical = [], [], []
    for repeat in range(args.repeats):
        base_s, base_out = run_baseline()
        engine_s, engine_out = asyncio.run(run_engine())
        base_tokens = sum(len(o) for o in base_out)
        engine_tokens = sum(len(o) for o in engine_out)
        base_rates.append(base_tokens / base_s)
        engine_rates.append(engine_tokens / engine_s)
        same = sum(a == b for a, b in zip(base_out, engine_out, strict=True))
        identical.append(same)
        print(
            f"repeat {repeat + 1}: generate {base_tokens} tok in {base_s:.1f} s ({base_rates[-1]:.1f} tok/s); "
            f"engine {engine_tokens} tok in {engine_s:.1f} s ({engine_rates[-1]:.1f} tok/s); "
            f"ratio {engine_rates[-1] / base_rates[-1]:.2f}x; identical outputs {same}/{len(prompts)}",
            file=sys.stderr,
        )
    engine.close()
    base_rate, engine_rate = statistics.median(base_rates), statistics.median(engine_rates)
    print(
        json.dumps(
            {
                "batched_speedup": round(engine_rate / base_rate, 3),
                "engine_tokens_per_s": round(engine_rate, 2),
                "generate_tokens_per_s": round(base_rate, 2),
                "sessions": args.sessions,
                "max_tokens": args.max_tokens,
                "identical_greedy_outputs": min(identical),
                "torch_threads": torch.get_num_threads(),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
