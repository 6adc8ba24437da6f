"""Agent harnesses: our white-box ReAct loop and runners for black-box harnesses (mini-swe-agent).

A harness talks to the model only through an OpenAI-compatible base URL + key (the gateway's per-session
endpoint) and acts on the task through a `ToolRuntime` (the sandbox). Training data never comes from here:
the gateway records every call; `HarnessResult` only says how the episode ended and why.
"""
