"""The ReAct harness's tool set: each tool has an OpenAI function schema and runs against a `ToolRuntime`.

Tools: `bash` (shell command in the sandbox), `str_replace_editor` (view / create / str_replace a file),
`submit` (end the episode). A tool set is chosen per sample by name (`HarnessSpec.tools`):
"bash", "edit" (= str_replace_editor), "submit".

Tools on a corpus, for environments whose tools run on the host against read-only data (environments.base
.HostTools; the search environment): `search` (BM25 hits: doc id, title, snippet), `read` (one passage by
doc id) and `answer` (the final answer; ends the episode and becomes the rollout's `final_answer`). They
call the runtime's `search_corpus` / `read_document` (`CorpusRuntime`): lookups in an index, nothing the agent
wrote is executed. On any other runtime they answer with an error the agent sees.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from harnessrl.harness.runtime import (
    OK,
    TIMEOUT,
    VIEW_MAX_LINE_BYTES,
    VIEW_MAX_LINES,
    FileView,
    ShellResult,
    ToolError,
    ToolRuntime,
    truncate,
)


class MalformedArguments(ValueError):
    """The model's tool arguments are not valid JSON or do not match the tool's schema."""


@dataclass
class Observation:
    content: str
    timed_out: bool = False
    submitted: bool = False
    answer: str | None = None  # the agent's final answer (the `answer` tool): the episode's final_answer


@runtime_checkable
class CorpusRuntime(Protocol):
    """A runtime with a read-only corpus behind it (what `search` and `read` call)."""

    def search_corpus(self, query: str, k: int) -> str: ...

    def read_document(self, doc_id: str) -> str: ...


@dataclass
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    execute: Callable[[dict[str, Any], ToolRuntime, float], Observation]

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def parse_arguments(tool: Tool, raw: str | dict | None) -> dict[str, Any]:
    """Parses and checks arguments against the tool's JSON schema (required keys, string/enum types)."""
    if isinstance(raw, dict):
        args = raw
    else:
        try:
            args = json.loads(raw or "{}")
        except json.JSONDecodeError as e:
            raise MalformedArguments(f"arguments for {tool.name} are not valid JSON: {e.msg}") from None
    if not isinstance(args, dict):
        raise MalformedArguments(f"arguments for {tool.name} must be a JSON object")
    props = tool.parameters.get("properties", {})
    for key in tool.parameters.get("required", []):
        if key not in args:
            raise MalformedArguments(f"{tool.name}: missing required argument {key!r}")
    for key, value in args.items():
        spec = props.get(key)
        if spec is None:
            raise MalformedArguments(f"{tool.name}: unknown argument {key!r} (allowed: {sorted(props)})")
        if spec.get("type") == "string" and not isinstance(value, str):
            raise MalformedArguments(f"{tool.name}: argument {key!r} must be a string")
        if spec.get("type") == "integer" and not _is_int(value):
            raise MalformedArguments(f"{tool.name}: argument {key!r} must be an integer")
        if spec.get("type") == "array" and not (
            isinstance(value, list)
            and (spec.get("items", {}).get("type") != "integer" or all(map(_is_int, value)))
        ):
            raise MalformedArguments(
                f"{tool.name}: argument {key!r} must be a list of {spec.get('items', {}).get('type', 'value')}s"
            )
        if "enum" in spec and value not in spec["enum"]:
            raise MalformedArguments(f"{tool.name}: argument {key!r} must be one of {spec['enum']}")
    return args


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def format_shell(res: ShellResult) -> str:
    if res.outcome == TIMEOUT:
        return f"<timeout>command did not finish in time and was killed</timeout>\n<output>\n{res.output}</output>"
    head = f"<returncode>{res.exit_code}</returncode>"
    if res.outcome not in (OK, "nonzero"):
        head = f"<outcome>{res.outcome}</outcome>\n{head}"
    return f"{head}\n<output>\n{res.output}</output>"


def _bash(args: dict[str, Any], runtime: ToolRuntime, timeout: float) -> Observation:
    res = runtime.run_shell(args["command"], timeout=timeout)
    return Observation(format_shell(res), timed_out=res.outcome == TIMEOUT)


def format_view(path: str, view: FileView) -> str:
    numbered = "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(view.lines, view.first))
    notes = []
    if view.cut_lines:
        notes.append(f"[{view.cut_lines} line(s) longer than {VIEW_MAX_LINE_BYTES} bytes are shown cut]")
    if not view.lines:
        notes.append(f"[no lines from {view.first}: {path} has {view.file_bytes} bytes]")
    elif view.more:
        notes.append(
            f"[{path} goes on after line {view.last} ({view.file_bytes} bytes in all): view more with "
            f"view_range [{view.last + 1}, {view.last + VIEW_MAX_LINES}], or search it with grep in bash]"
        )
    return truncate("\n".join([numbered, *notes]) if notes else numbered)


def _editor(args: dict[str, Any], runtime: ToolRuntime, timeout: float) -> Observation:
    cmd, path = args["command"], args["path"]
    try:
        if cmd == "view":
            first, last = _view_range(args.get("view_range"))
            return Observation(format_view(path, runtime.view_file(path, first, last)))
        if cmd == "create":
            if "file_text" not in args:
                raise MalformedArguments("str_replace_editor create: missing required argument 'file_text'")
            runtime.write_file(path, args["file_text"])
            return Observation(f"File created: {path}")
        if cmd == "str_replace":
            if "old_str" not in args:
                raise MalformedArguments(
                    "str_replace_editor str_replace: missing required argument 'old_str'"
                )
            text = runtime.read_file(path)
            count = text.count(args["old_str"])
            if count != 1:
                return Observation(
                    f"Error: old_str occurs {count} times in {path}; it must occur exactly once."
                )
            runtime.write_file(path, text.replace(args["old_str"], args.get("new_str", ""), 1))
            return Observation(f"Edited {path}: replaced 1 occurrence.")
    except ToolError as e:  # the agent's request, not the harness, is at fault: tell the agent
        return Observation(f"Error: {e}")
    raise MalformedArguments(f"str_replace_editor: unknown command {cmd!r}")


def _view_range(raw: list[int] | None) -> tuple[int, int | None]:
    if raw is None:
        return 1, None
    if len(raw) != 2:
        raise MalformedArguments("str_replace_editor view_range: give [first, last] (last -1: to the end)")
    first, last = raw
    return first, None if last == -1 else last


def _submit(args: dict[str, Any], runtime: ToolRuntime, timeout: float) -> Observation:
    return Observation("Submitted.", submitted=True)


def _search(args: dict[str, Any], runtime: ToolRuntime, timeout: float) -> Observation:
    if not isinstance(runtime, CorpusRuntime):
        return Observation("Error: this task has no corpus to search.")
    k = max(1, min(int(args.get("k", SEARCH_K)), SEARCH_MAX_K))
    return Observation(runtime.search_corpus(args["query"], k))


def _read(args: dict[str, Any], runtime: ToolRuntime, timeout: float) -> Observation:
    if not isinstance(runtime, CorpusRuntime):
        return Observation("Error: this task has no corpus to read from.")
    return Observation(runtime.read_document(args["doc_id"]))


def _answer(args: dict[str, Any], runtime: ToolRuntime, timeout: float) -> Observation:
    return Observation("Answer recorded.", submitted=True, answer=args["answer"])


SEARCH_K, SEARCH_MAX_K = 5, 10
BASH = Tool(
    "bash",
    "Run a bash command in the repository root. Each call runs in a fresh shell.",
    {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "the command"}},
        "required": ["command"],
    },
    _bash,
)
EDITOR = Tool(
    "str_replace_editor",
    "View a file (with line numbers; long files in pages: view_range), create a file, or replace exactly "
    "one occurrence of old_str with new_str.",
    {
        "type": "object",
        "properties": {
            "command": {"type": "string", "enum": ["view", "create", "str_replace"]},
            "path": {"type": "string", "description": "path relative to the repository root"},
            "file_text": {"type": "string"},
            "old_str": {"type": "string"},
            "new_str": {"type": "string"},
            "view_range": {
                "type": "array",
                "items": {"type": "integer"},
                "description": "view only: [first, last] line numbers, 1-based; last -1 reads to the end",
            },
        },
        "required": ["command", "path"],
    },
    _editor,
)
SUBMIT = Tool(
    "submit", "Submit your changes and end the task.", {"type": "object", "properties": {}}, _submit
)
SEARCH = Tool(
    "search",
    "Search the corpus; returns the best-matching passages: doc_id, title and a snippet.",
    {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "words to search for"},
            "k": {
                "type": "integer",
                "description": f"how many hits (default {SEARCH_K}, at most {SEARCH_MAX_K})",
            },
        },
        "required": ["query"],
    },
    _search,
)
READ = Tool(
    "read",
    "Read one passage of the corpus in full.",
    {
        "type": "object",
        "properties": {"doc_id": {"type": "string", "description": "a doc_id from a search hit"}},
        "required": ["doc_id"],
    },
    _read,
)
ANSWER = Tool(
    "answer",
    "Give your final answer (only the answer, as the text states it) and end the task.",
    {
        "type": "object",
        "properties": {"answer": {"type": "string", "description": "the answer"}},
        "required": ["answer"],
    },
    _answer,
)

TOOLS_BY_SPEC_NAME: dict[str, Tool] = {
    "bash": BASH,
    "edit": EDITOR,
    "str_replace_editor": EDITOR,
    "submit": SUBMIT,
    "search": SEARCH,
    "read": READ,
    "answer": ANSWER,
}


def toolset(names: list[str]) -> dict[str, Tool]:
    unknown = [n for n in names if n not in TOOLS_BY_SPEC_NAME]
    if unknown:
        raise ValueError(
            f"unknown tool(s) {unknown} in harness spec; choose from {sorted(TOOLS_BY_SPEC_NAME)}"
        )
    tools = [TOOLS_BY_SPEC_NAME[n] for n in names]
    return {t.name: t for t in tools}
