"""Turn rows with the request shapes real agent CLIs send (our own texts, their structure).

Recorded from Claude Code 2.1.197, Codex CLI 0.171.0 and OpenClaw 2026.9.6 against a local
server: which messages each call carries, in which order, what moves between calls, which side
calls share a session. Each call's prompt IDs are the embedded engine's chat template over the
messages the agent sent, tokenized by the engine's tokenizer as the engine does (turn by turn);
the response IDs are what the engine generates for the reply (its text, then the end-of-turn
token). So consecutive calls relate token for token as they would through ``claw proxy`` +
``claw sim``.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from claw_pipelines.engine.chat_template import assistant_text, render_turns
from claw_pipelines.engine.protocol import Message, Tool
from claw_pipelines.engine.tokenizer import IM_END_ID, encode, encode_turns


def _tool(name: str, **properties: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {k: {"type": v} for k, v in properties.items()}}
    return {"type": "function", "function": {"name": name, "parameters": schema}}


SHELL = _tool("shell", command="string")
AGENT = _tool("start_agent", task="string")
SPAWN = _tool("spawn_agent", message="string")
WAIT = _tool("wait_agent", target="string")


def call(
    turn_id: str,
    messages: list[dict[str, Any]],
    reply: dict[str, Any],
    *,
    start: datetime,
    tools: list[dict[str, Any]] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A successful engine turn (``turns`` row fields): the engine's prompt for ``messages``
    and ``tools``, ``reply`` generated; it took one second."""
    prompt = render_turns([Message(**m) for m in messages], [Tool(**t) for t in tools or []])
    response = [*encode(assistant_text(Message(**reply))), IM_END_ID]
    return {
        "turn_id": turn_id, "trajectory_id": None, "agent": "agent", "channel": "train",
        "policy_version": 1, "model": "policy", "token_source": "engine",
        "prompt_token_ids": encode_turns(prompt), "response_token_ids": response,
        "response_logprobs": [-0.25] * len(response),
        "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop",
        "request_messages": json.dumps(messages),
        "request_tools": json.dumps(tools) if tools else None,
        "response_message": json.dumps(reply), "response_text": reply.get("content"),
        "started_at": start, "ended_at": start + timedelta(seconds=1), **fields,
    }  # fmt: skip


def _at(start: datetime, seconds: float) -> datetime:
    return start + timedelta(seconds=seconds)


def says(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def calls(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": function}]}  # fmt: skip


def result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def system(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


def context(jobs: str) -> dict[str, Any]:
    """OpenClaw's internal-context message: a user message of one text part, at the very end."""
    text = f"[[session context]]\nbackground jobs: {jobs}\nhelper agents: none\n[[end]]"
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def trailing_context_session(
    prefix: str,
    *,
    start: datetime,
    trajectory_id: str | None = None,
    task: str = "List the files in the work folder.",
    listing: str = "notes.txt",
    **fields: Any,
) -> list[dict[str, Any]]:
    """OpenClaw on chat completions: every request ends with the context message; on the next
    call it is taken out and appended again after the new messages (its text may change). Two
    user turns, each a shell call then an answer."""
    head = [system("You are a home assistant that runs on a small server."),
            user(f"[Mon 09:00] {task}\n\nRuntime: agent=main | model=policy")]  # fmt: skip
    first = calls("call1", "shell", command="ls")
    answer = says(f"There is one file: {listing}.")
    follow = user("[Mon 09:05] Show its first line.")
    second = calls("call2", "shell", command=f"head -n 1 {listing}")
    history = [
        ([*head, context("none")], first),
        ([*head, first, result("call1", listing), context("none")], answer),
        ([*head, first, result("call1", listing), answer, follow, context("1 (tail)")], second),
        ([*head, first, result("call1", listing), answer, follow, second,
          result("call2", "buy milk"), context("none")], says("It says: buy milk.")),
    ]  # fmt: skip
    return [
        call(f"{prefix}-{i}", messages, reply, start=_at(start, 10 * i), tools=[SHELL],
             trajectory_id=trajectory_id, **fields)
        for i, (messages, reply) in enumerate(history)
    ]  # fmt: skip


def claude_code_session(
    prefix: str, trajectory_id: str, *, start: datetime, group_id: str | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Claude Code with one identity header on every call: a title call on the small model first
    (own system prompt, no tools), the main conversation (a user message of reminder + task, a
    system message inside the conversation), and a sub-agent it starts (own system prompt)."""
    ids = {"trajectory_id": trajectory_id, "group_id": group_id}
    task = "Fix the failing unit test."
    title = call(f"{prefix}-title", [
        system("Name the conversation below in at most five words. Answer in JSON."),
        user(f"<conversation>\n{task}\n</conversation>")], says('{"title": "Fix failing test"}'),
        start=start, model="small", **ids)  # fmt: skip
    main = [system("You are a coding agent in a terminal. Be brief."),
            user(f"<reminder>Today is Monday.</reminder>\n{task}"),
            system("Agents you can start: helper (any task).")]  # fmt: skip
    start_helper = calls("toolu_1", "start_agent", task="Run the tests and report failures.")
    helper = [system("You are a helper agent. Do the task, then report back."),
              user("Run the tests and report failures."), system("Skills: none.")]  # fmt: skip
    run_tests = calls("toolu_2", "shell", command="pytest -q")
    report = "One test fails: test_sum."
    return {
        "title": [title],
        "main": [
            call(f"{prefix}-main-0", main, start_helper, start=_at(start, 1),
                 tools=[SHELL, AGENT], **ids),
            call(f"{prefix}-main-1", [*main, start_helper, result("toolu_1", report)],
                 says("The helper found one failing test: test_sum."), start=_at(start, 30),
                 tools=[SHELL, AGENT], **ids),
        ],
        "helper": [
            call(f"{prefix}-helper-0", helper, run_tests, start=_at(start, 10), tools=[SHELL],
                 **ids),
            call(f"{prefix}-helper-1", [*helper, run_tests, result("toolu_2", "1 failed")],
                 says(report), start=_at(start, 20), tools=[SHELL], **ids),
        ],
    }  # fmt: skip


def codex_session(prefix: str, trajectory_id: str, *, start: datetime):
    """Codex CLI with a sub-agent: the sub-agent starts from the same developer messages and
    environment message as the main conversation, with its own task; the two interleave."""
    opening = [{"role": "developer", "content": "You are a coding agent working in a terminal."},
               {"role": "developer", "content": "Sandbox: full access. Approvals: never."},
               user("<environment>\ncwd: /work\nshell: bash\n</environment>")]  # fmt: skip
    main = [*opening, user("Ask a helper to count the lines of notes.txt.")]
    helper = [*opening, user("Count the lines of notes.txt.")]
    spawn = calls("call_1", "spawn_agent", message="Count the lines of notes.txt.")
    wait = calls("call_2", "wait_agent", target="helper-1")
    count = calls("call_3", "shell", command="wc -l notes.txt")
    counted = "notes.txt has 3 lines."
    spawned = [*main, spawn, result("call_1", '{"agent_id": "helper-1"}')]
    main_calls = [
        (main, spawn),
        (spawned, wait),
        ([*spawned, wait, result("call_2", counted)], says("It has 3 lines.")),
    ]
    helper_calls = [(helper, count), ([*helper, count, result("call_3", "3 notes.txt")],
                                      says(counted))]  # fmt: skip
    tools = [SHELL, SPAWN, WAIT]
    return {
        "main": [call(f"{prefix}-main-{i}", m, r, start=_at(start, 20 * i), tools=tools,
                      trajectory_id=trajectory_id) for i, (m, r) in enumerate(main_calls)],
        "helper": [call(f"{prefix}-helper-{i}", m, r, start=_at(start, 5 + 20 * i),
                        tools=tools, trajectory_id=trajectory_id)
                   for i, (m, r) in enumerate(helper_calls)],
    }  # fmt: skip
