"""The `search` environment: answer a question by searching a local corpus, graded by exact match or F1.

The corpus (corpus.py: passages from the installed packages' metadata) travels inside the task set as the
data file of its rows' `repo` (`corpus/<sha256 prefix>`, stored at `repos/corpus__<prefix>.bundle`: the
task set's per-repo file, so `select` and `clean` carry it along with the rows; the name is the task set's
convention, the content JSONL). The agent's tools (harness/tools.py: `search`, `read`, `answer`) run on the
host, in the rollout's process, against a BM25 index of that corpus (index.py, built once per process and
corpus): a tool call is a lookup in read-only data, never code the agent wrote, so there is no workspace and
no sandbox (environments.base.HostTools). The `react` harness runs these tasks; `chat` may too (an answer
from memory alone).

Task rows (a task set's tasks.jsonl; `harnessrl tasks search` writes them from questions.py):
    {"instance_id": "search-license-numpy", "environment": "search", "repo": "corpus/<prefix>",
     "problem_statement": "<the question and how to answer>", "question": "...", "answers": ["BSD-3-Clause"],
     "doc_id": "numpy/card", "kind": "license"}

Rewards: `search_em` (default: 1 when the extracted answer equals a gold answer after SQuAD-style
normalization, score.py) and `search_f1` (token F1 — partial credit — but 0 for an answer more than
`F1_MAX_LENGTH_FACTOR` times longer than the gold answer plus two tokens: a pasted passage or corpus dump
earns nothing). The answer is the `answer` tool's argument, else the agent's last reply; from either,
score.extract_answer takes the last <answer>...</answer> or the last line. Parts: em and f1.
"""

from __future__ import annotations

import functools
import hashlib
import random
import tempfile
import threading
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.environments.base import Environment, Episode, Finished, Grading, Reward
from harnessrl.environments.search.corpus import read_packages
from harnessrl.environments.search.score import exact_match, extract_answer, normalize_answer, token_f1
from harnessrl.harness.runtime import NoToolsRuntime
from harnessrl.schema import HarnessName, HarnessSpec

if TYPE_CHECKING:
    from harnessrl.environments.search.index import SearchIndex
    from harnessrl.environments.search.questions import Question
    from harnessrl.taskset import TaskSet

EM, F1 = "search_em", "search_f1"
F1_MAX_LENGTH_FACTOR = 3
CORPUS_REPO_PREFIX = "corpus/"
TOOLS = ("search", "read", "answer")
SYSTEM_PROMPT = (
    "You answer questions about Python packages by searching their documentation. Use the search tool to "
    "find passages, the read tool to read one, and the answer tool to give the answer: only the exact words "
    "from the passage. Call exactly one tool per turn."
)
INSTRUCTION = (
    "Search the documentation of the installed Python packages (tools: search, read) and give the answer "
    "with the answer tool, exactly as the passage states it."
)
_index_lock = threading.Lock()


class SearchSplit(StrEnum):
    """Which packages a task set asks about: `train` and `test` never share one (by a hash of its name)."""

    TRAIN = "train"
    TEST = "test"
    ALL = "all"


def _check(row: Mapping[str, Any]) -> None:
    where = f"task {row.get('instance_id')!r} (search)"
    for key in ("instance_id", "problem_statement", "question", "repo"):
        if not isinstance(row.get(key), str) or not row[key]:
            raise ValueError(f"{where}: needs a non-empty {key!r}")
    answers = row.get("answers")
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a for a in answers):
        raise ValueError(f"{where}: 'answers' must be a non-empty list of non-empty strings")
    if not str(row["repo"]).startswith(CORPUS_REPO_PREFIX):
        raise ValueError(f"{where}: 'repo' must name its corpus ('{CORPUS_REPO_PREFIX}<sha256 prefix>')")


class SearchRuntime(NoToolsRuntime):
    """The tools' runtime for one task: the corpus's index, read-only (tools.CorpusRuntime); files and
    commands are refused (there is no workspace)."""

    def __init__(self, index: SearchIndex, workspace: Path) -> None:
        super().__init__(workspace)
        self.index = index

    def search_corpus(self, query: str, k: int) -> str:
        with _index_lock:  # bm25s scoring is not documented as thread-safe; a query takes ~1 ms
            hits = self.index.search(query, k)
        if not hits:
            return "No passage matches that query; try other words."
        return "\n".join(f"{i}. [{h.doc_id}] {h.title}\n   {h.snippet}" for i, h in enumerate(hits, 1))

    def read_document(self, doc_id: str) -> str:
        from harnessrl.environments.search.index import UnknownDocument

        try:
            return self.index.read(doc_id.strip())
        except UnknownDocument as e:
            return f"Error: {e}"


@functools.lru_cache(maxsize=8)
def _index(path: str, size: int, mtime_ns: int, prefix: str) -> SearchIndex:
    from harnessrl.environments.search.index import SearchIndex

    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    if not digest.startswith(prefix):
        raise ValueError(
            f"{path}: corpus sha256 {digest[:12]} does not match its name {prefix!r}; rebuild it"
        )
    return SearchIndex.from_corpus(Path(path))


def corpus_index(row: Mapping[str, Any], taskset: TaskSet) -> SearchIndex:
    """The index of the task's corpus (built once per process; FileNotFoundError naming the file)."""
    path = taskset.bundle(str(row["repo"]))
    if not path.is_file():
        raise FileNotFoundError(
            f"task {row.get('instance_id')!r}: corpus {row['repo']!r} missing from the task set ({path}); "
            "write the task set with `harnessrl tasks search`"
        )
    st = path.stat()
    with _index_lock:
        return _index(
            str(path.resolve()), st.st_size, st.st_mtime_ns, str(row["repo"])[len(CORPUS_REPO_PREFIX) :]
        )


class SearchEnvironment(Environment):
    name: str = "search"
    reward_names: tuple[str, ...] = (EM, F1)
    host_tools: tuple[str, ...] = TOOLS

    def check_task(self, row: Mapping[str, Any]) -> None:
        _check(row)

    def episode(self, row: Mapping[str, Any]) -> Episode:
        spec = HarnessSpec(
            harness=HarnessName.REACT,
            tools=list(TOOLS),
            reward=EM,
            limits={"turns": 4, "tokens": 4096, "wall_s": 300},
            options={"max_tokens_per_turn": 128, "on_no_tool_call": "end", "system_prompt": SYSTEM_PROMPT},
        )
        return Episode(prompt=str(row["problem_statement"]), workspace=False, default_spec=spec)

    def host_runtime(self, row: Mapping[str, Any], taskset: TaskSet) -> SearchRuntime:
        return SearchRuntime(corpus_index(row, taskset), taskset.root)

    def reward(self, row: Mapping[str, Any], finished: Finished, reward: str, grading: Grading) -> Reward:
        _check(row)
        answers = list(row["answers"])
        answer = extract_answer(finished.answer)
        em = exact_match(answer, answers)
        f1 = token_f1(answer, answers)
        longest = max(len(normalize_answer(a).split()) for a in answers)
        if len(normalize_answer(answer).split()) > F1_MAX_LENGTH_FACTOR * longest + 2:
            f1 = 0.0  # a pasted passage, a dump or a list of guesses: no partial credit
        total = em if reward == EM else f1
        return Reward(total, {"em": em, "f1": f1}, detail=f"answer {answer[:80]!r}: EM {em:g}, F1 {f1:.2f}")


def task_row(question: Question, corpus_repo: str) -> dict[str, Any]:
    return {
        "instance_id": f"search-{question.task_id.replace(':', '-')}",
        "environment": "search",
        "repo": corpus_repo,
        "problem_statement": f"{question.question}\n\n{INSTRUCTION}",
        "question": question.question,
        "answers": list(question.answers),
        "doc_id": question.doc_id,
        "kind": question.kind.value,
    }


def _package_split(task_id: str) -> SearchSplit:
    package = task_id.split(":", 1)[-1]
    bit = hashlib.sha256(package.encode()).digest()[0] & 1
    return SearchSplit.TRAIN if bit == 0 else SearchSplit.TEST


def write_search_taskset(
    out: str | Path,
    n: int,
    seed: int,
    split: SearchSplit = SearchSplit.ALL,
    kinds: Sequence[str] | None = None,
    site_dirs: Sequence[Path] | None = None,
) -> TaskSet:
    """A task set of `n` questions (drawn with `seed` from those of `kinds`, of the split's packages) about
    the corpus of the installed distributions (`site_dirs`: default this interpreter's), the corpus with it."""
    from harnessrl.environments.search.corpus import build_corpus, write_corpus
    from harnessrl.environments.search.questions import QuestionKind, make_questions
    from harnessrl.taskset import write_taskset

    if kinds:
        unknown = sorted(set(kinds) - {k.value for k in QuestionKind})
        if unknown:
            raise ValueError(f"unknown question kind(s) {unknown}; choose from {', '.join(QuestionKind)}")
    sites = list(site_dirs) if site_dirs is not None else None
    passages = build_corpus(sites)
    questions = make_questions(read_packages(sites), passages)
    pool = [
        q
        for q in questions
        if (not kinds or q.kind.value in kinds)
        and (split is SearchSplit.ALL or _package_split(q.task_id) is split)
    ]
    if n > len(pool):
        raise ValueError(f"{n} search questions asked for, {len(pool)} match (split {split}, kinds {kinds})")
    chosen = random.Random(seed).sample(pool, n)
    with tempfile.TemporaryDirectory() as tmp:
        corpus_path = Path(tmp) / "corpus.jsonl"
        info = write_corpus(passages, corpus_path)
        repo = f"{CORPUS_REPO_PREFIX}{info.sha256[:16]}"
        rows = [task_row(q, repo) for q in chosen]
        source = f"search: {n} questions (seed {seed}, {split} packages) over {info.passages} passages"
        meta = {
            "environment": "search",
            "split": str(split),
            "corpus": {"passages": info.passages, "sha256": info.sha256},
        }
        return write_taskset(out, rows, {repo: corpus_path}, source, meta)
