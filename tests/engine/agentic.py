"""A multi-turn agentic workload for the local engine (tests and benchmarks/engine.py).

Every session starts from the same system prompt with Hermes-style tool definitions (what the gateway renders
for ChatML models), then its own task; each turn appends the model's reply and a tool result (a seeded,
file-listing-like text of varying length) to the token history, as the gateway's chain does. Histories are
token continuations, so a prefix cache can reuse each session's previous turn."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

from harnessrl.engine.base import Generation, SamplingParams

# single-turn prompts that ask for long answers (the benchmarks' batch workloads)
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

TOOLS = [
    {
        "name": "bash",
        "description": "Run a shell command in the repository and return its output (stdout and stderr, "
        "truncated to 4000 characters). Use it to list files, read code, run the tests.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the command line to run"}},
            "required": ["command"],
        },
    },
    {
        "name": "edit",
        "description": "Replace an exact, unique snippet of a file with new text. Fails if the snippet is "
        "missing or appears more than once; read the file first.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "file path relative to the repository root"},
                "old": {"type": "string", "description": "the exact text to replace"},
                "new": {"type": "string", "description": "the replacement text"},
            },
            "required": ["path", "old", "new"],
        },
    },
    {
        "name": "submit",
        "description": "Finish the episode: the current state of the repository is your answer.",
        "parameters": {"type": "object", "properties": {}},
    },
]

SYSTEM = (
    "You are a software engineer fixing a bug in the repository in your current directory. Use the tools to "
    "inspect and edit the code and run tests. Call exactly one tool per turn. When the fix is done, call "
    "submit.\n\n# Tools\n\nYou may call one or more functions to assist with the user query. You are provided "
    "with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + "\n".join(json.dumps({"type": "function", "function": t}) for t in TOOLS)
    + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
    "\n</tool_call>"
)

TASKS = [
    "The function `parse_duration` in utils/time.py returns minutes when given hours. Fix it.",
    "Tests in tests/test_cache.py fail: the LRU cache evicts the most recently used item.",
    "`Config.load` crashes on an empty YAML file with a TypeError. Make it return the defaults.",
    "The CLI prints the help text twice when called without arguments.",
    "`merge_intervals` drops the last interval when the input is unsorted.",
    "Division by zero in stats.mean for an empty list; it should raise ValueError with a message.",
    "The CSV exporter writes dates in the local time zone instead of UTC.",
    "`slugify` keeps trailing dashes; the tests expect them stripped.",
]


def tool_output(session: int, turn: int) -> str:
    """A seeded tool result of 40-160 tokens: a listing, test output or file excerpt."""
    rng = random.Random(session * 1000 + turn)
    kind = rng.choice(["ls", "pytest", "cat"])
    if kind == "ls":
        return "\n".join(
            f"{rng.choice(['src', 'tests', 'utils', 'docs'])}/{rng.choice(['core', 'io', 'cli', 'time'])}_"
            f"{rng.randint(1, 99)}.py"
            for _ in range(rng.randint(6, 20))
        )
    if kind == "pytest":
        lines = [f"tests/test_{rng.randint(1, 30)}.py::test_case_{turn} {rng.choice(['PASSED', 'FAILED'])}"]
        lines += [
            f"tests/test_{rng.randint(1, 30)}.py::test_{rng.choice(['load', 'save', 'parse'])}_{i} PASSED"
            for i in range(rng.randint(3, 9))
        ]
        return "\n".join(lines) + f"\n{rng.randint(1, 4)} failed, {rng.randint(5, 40)} passed in 0.4s"
    return "\n".join(
        f"def func_{i}(x, y={rng.randint(0, 9)}):\n    return x * {rng.randint(2, 9)} + y"
        for i in range(rng.randint(3, 8))
    )


@dataclass
class SessionTrace:
    prompts: list[int] = field(default_factory=list)  # prompt length per turn
    outputs: list[list[int]] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)  # prompt tokens served from the prefix cache


class AgenticWorkload:
    def __init__(self, tokenizer: Any, sessions: int, turns: int, max_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.sessions, self.turns, self.max_tokens = sessions, turns, max_tokens
        self.im_end = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))

    def first_prompt(self, session: int) -> list[int]:
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": TASKS[session % len(TASKS)]},
        ]
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )

    def next_prompt(self, prompt: list[int], output: list[int], session: int, turn: int) -> list[int]:
        """The history after this turn: prompt + reply (closed with <|im_end|>) + a tool result message."""
        reply = output if output and output[-1] == self.im_end else [*output, self.im_end]
        result = self.tool_text(session, turn)
        text = f"\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        return prompt + reply + self.tokenizer.encode(text, add_special_tokens=False)

    def turns_of(self, session: int) -> int:
        return self.turns

    def tool_text(self, session: int, turn: int) -> str:
        return tool_output(session, turn)

    def tool_s(self, session: int, turn: int) -> float:
        """Seconds the tool call after this turn takes (none here; see RoutedWorkload)."""
        return 0.0

    async def run_session(self, engine: Any, session: int, sampling: SamplingParams) -> SessionTrace:
        trace = SessionTrace()
        prompt = self.first_prompt(session)
        for turn in range(self.turns_of(session)):
            if turn and self.tool_s(session, turn - 1):
                await asyncio.sleep(self.tool_s(session, turn - 1))
            start = time.perf_counter()
            gen: Generation = await self.generate(engine, session, prompt, sampling)
            trace.latencies.append(time.perf_counter() - start)
            trace.prompts.append(len(prompt))
            trace.outputs.append(gen.token_ids)
            trace.cached.append(gen.cached_prompt_tokens)
            prompt = self.next_prompt(prompt, gen.token_ids, session, turn)
        return trace

    async def generate(
        self, engine: Any, session: int, prompt: list[int], sampling: SamplingParams
    ) -> Generation:
        return await engine.generate(prompt, sampling, self.max_tokens)

    async def run(self, engine: Any, sampling: SamplingParams | None = None) -> list[SessionTrace]:
        """Every session concurrently, each turn after the previous one's reply."""
        greedy = sampling or SamplingParams(temperature=0.0)
        return list(
            await asyncio.gather(*(self.run_session(engine, s, greedy) for s in range(self.sessions)))
        )


class RoutedWorkload(AgenticWorkload):
    """The same sessions through a `Router` (each request names its session), with a seeded long tail: turns
    per session vary (1-2x `turns`), some tool results are long, and tools take time between turns."""

    def __init__(self, tokenizer: Any, sessions: int, turns: int, max_tokens: int, seed: int = 0) -> None:
        super().__init__(tokenizer, sessions, turns, max_tokens)
        rng = random.Random(seed)
        self._turns = [rng.randint(turns, 2 * turns) for _ in range(sessions)]
        self._tool_s = [
            [min(3.0, rng.paretovariate(2.0) * 0.3) for _ in range(2 * turns)] for _ in range(sessions)
        ]
        self._long = [[rng.random() < 0.15 for _ in range(2 * turns)] for _ in range(sessions)]

    def turns_of(self, session: int) -> int:
        return self._turns[session]

    def tool_s(self, session: int, turn: int) -> float:
        return self._tool_s[session][turn]

    def tool_text(self, session: int, turn: int) -> str:
        if not self._long[session][turn]:
            return tool_output(session, turn)
        return "\n".join(tool_output(session * 7 + i, turn) for i in range(8))  # a long file dump

    async def generate(
        self, engine: Any, session: int, prompt: list[int], sampling: SamplingParams
    ) -> Generation:
        return await engine.generate(prompt, sampling, self.max_tokens, session_id=f"session-{session}")
