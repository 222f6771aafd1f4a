"""Tools: the calculator, and an agent's own tools called with harmless arguments in a loop.

The loop tests run every call the policy makes for real, as an agent would: shell commands in a
temporary working directory, reads and listings of its files.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from claw_pipelines.demo import CALCULATOR_TOOL
from claw_pipelines.engine.agent_tools import listed_files, tool_output
from claw_pipelines.engine.exploring import MAX_TOOL_CALLS
from claw_pipelines.engine.policy import NO_TASK_REPLY, Draft, respond_chat
from claw_pipelines.engine.protocol import Message, Tool
from claw_pipelines.engine.tasks import parse_final_answer


def function(name: str, required: int = 1, **properties: dict) -> dict:
    schema = {"type": "object", "properties": properties, "required": list(properties)[:required]}
    return {"type": "function", "function": {"name": name, "parameters": schema}}


STRING = {"type": "string"}
BASH = function("Bash", command=STRING, description=STRING)
READ = function("Read", file_path=STRING, offset={"type": "integer"})
AGENT = function("Agent", 2, description=STRING, prompt=STRING, subagent_type=STRING)
EXEC_COMMAND = function("exec_command", cmd=STRING, workdir=STRING)
ARGV_SHELL = function("shell", command={"type": "array", "items": STRING})
MCP_LIST = function("mcp__files__list_directory", path=STRING)
MCP_READ = function("mcp__files__read_file", path=STRING)
APPLY_PATCH = function("apply_patch", input=STRING)
EDIT = function("Edit", 3, file_path=STRING, old_string=STRING, new_string=STRING)
WRITE = function("Write", 2, file_path=STRING, content=STRING)
WEB_FETCH = function("WebFetch", 2, url=STRING, prompt=STRING)
UNSAFE = [APPLY_PATCH, EDIT, WRITE, WEB_FETCH]
QUESTION = [Message(role="user", content="What is 37 + 45?")]
LOOK = "Look around the working directory and tell me what is there."
FILES = {"README.md": "# Demo\nA tiny project.\n", "notes.txt": "one\ntwo\nthree\n", "a.py": "x\n"}


def tools(*declared: dict) -> list[Tool]:
    return [Tool.model_validate(tool) for tool in declared]


def workdir(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).write_text(text)
    (root / "src").mkdir()
    (root / "src" / "inner.txt").write_text("never read\n")
    return root


def execute(name: str, arguments: dict, cwd: Path) -> str:
    """Run one call as the agent would; a call to anything else fails the test."""
    if name in ("Bash", "exec_command", "shell"):
        command = arguments.get("command") or arguments.get("cmd")
        argv = command if isinstance(command, list) else ["bash", "-c", command]
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=10)
        return done.stdout + done.stderr
    if name in ("Read", "mcp__files__read_file"):
        path = Path(arguments.get("file_path") or arguments["path"])
        return (path if path.is_absolute() else cwd / path).read_text()
    if name == "mcp__files__list_directory":
        folder = cwd / arguments["path"]
        return "\n".join(p.name + "/" * p.is_dir() for p in sorted(folder.iterdir()))
    raise AssertionError(f"called {name} {arguments}")


def run_loop(
    declared: list[dict], prompt: str, cwd: Path, seed: int
) -> tuple[list[tuple[str, dict]], Draft]:
    """The policy against ``cwd`` until it answers: every call made, and the answer."""
    messages = [Message(role="user", content=prompt)]
    calls: list[tuple[str, dict]] = []
    rng = random.Random(seed)
    for index in range(MAX_TOOL_CALLS + 2):
        draft = respond_chat(messages, tools(*declared), None, 4000, rng)
        if draft.tool_call is None:
            return calls, draft
        name, arguments = draft.tool_call.name, json.loads(draft.tool_call.arguments)
        calls.append((name, arguments))
        call = {"id": f"call-{index}", "function": draft.tool_call.model_dump()}
        messages.append(Message(role="assistant", tool_calls=[call]))
        output = execute(name, arguments, cwd)
        messages.append(Message(role="tool", tool_call_id=f"call-{index}", content=output))
    raise AssertionError(f"no answer after {len(calls)} calls")


@pytest.mark.parametrize("choice", [None, "auto", "required", "Edit", "apply_patch"])
def test_tools_that_write_or_reach_out_are_never_called(choice: str | None) -> None:
    """With a task or without, patch / edit / write / web tools get no call: a text answer."""
    for messages in (QUESTION, [Message(role="user", content=LOOK)]):
        for seed in range(40):
            draft = respond_chat(messages, tools(*UNSAFE), choice, 200, random.Random(seed))
            assert draft.tool_call is None
            assert draft.text


def test_required_without_a_callable_tool_answers_the_task_in_text(client: TestClient) -> None:
    body = {"messages": [{"role": "user", "content": "What is 37 + 45?"}], "seed": 3}
    for choice in ("required", {"type": "function", "function": {"name": "Edit"}}):
        response = client.post(
            "/v1/chat/completions",
            json={**body, "tools": UNSAFE, "tool_choice": choice, "max_tokens": 2000},
        )
        message = response.json()["choices"][0]["message"]
        assert "tool_calls" not in message
        assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_only_the_calculator_is_called_among_an_agents_tools() -> None:
    declared = tools(BASH, CALCULATOR_TOOL, READ)
    calls = [
        respond_chat(QUESTION, declared, "required", 200, random.Random(seed)).tool_call
        for seed in range(30)
    ]
    assert {call.name for call in calls if call} == {"calculator"}
    assert all(calls)


def test_a_calculator_taking_other_arguments_is_not_called() -> None:
    other = tools(function("calculator", a={"type": "number"}, b={"type": "number"}))
    for seed in range(30):
        assert respond_chat(QUESTION, other, "required", 200, random.Random(seed)).tool_call is None


@pytest.mark.parametrize("shell", [BASH, EXEC_COMMAND, ARGV_SHELL])
def test_without_a_calculator_the_shell_computes_the_task(shell: dict, tmp_path: Path) -> None:
    """Forced, the policy computes with shell arithmetic and answers from what it printed."""
    draft = respond_chat(QUESTION, tools(shell, READ), "required", 200, random.Random(0))
    assert draft.tool_call is not None
    arguments = json.loads(draft.tool_call.arguments)
    output = execute(draft.tool_call.name, arguments, tmp_path)
    assert output.strip() == "82"
    call = {"id": "c1", "function": draft.tool_call.model_dump()}
    answered = [Message(role="assistant", tool_calls=[call])]
    answered.append(Message(role="tool", tool_call_id="c1", content=output))
    for seed in range(20):
        after = respond_chat([*QUESTION, *answered], tools(shell), None, 200, random.Random(seed))
        assert after.tool_call is not None or parse_final_answer(after.text) == 82


@pytest.mark.parametrize(
    "declared",
    [[EXEC_COMMAND], [ARGV_SHELL], [BASH, READ, AGENT, *UNSAFE], [MCP_LIST, MCP_READ]],
    ids=["codex", "argv-shell", "claude-code", "mcp"],
)
def test_the_loop_looks_around_reads_each_file_and_answers(
    declared: list[dict], tmp_path: Path
) -> None:
    cwd = workdir(tmp_path, FILES)
    answers = set()
    for seed in range(6):
        calls, answer = run_loop(declared, LOOK, cwd, seed)
        assert len(calls) >= 2
        read = [n for n, a in calls if n in ("Read", "mcp__files__read_file") or "cat " in str(a)]
        assert 1 <= len(read) <= len(FILES)
        lines = parse_final_answer(answer.text)
        assert lines is not None and 0 < lines <= 6
        answers.add(lines)
        assert "inner" not in str(calls)  # never into a directory
    assert 6 in answers  # all three files (2 + 3 + 1 lines) read in most runs


def test_the_loop_reads_by_absolute_path_from_pwd(tmp_path: Path) -> None:
    """Claude Code's Read takes absolute paths: the policy builds them from ``pwd``."""
    cwd = workdir(tmp_path, FILES)
    calls, _ = run_loop([BASH, READ], LOOK, cwd, 1)
    assert [a["command"] for n, a in calls[:2]] == ["pwd", "ls -p"]
    assert all(n == "Read" and Path(a["file_path"]).parent == cwd for n, a in calls[2:])


def test_the_loop_is_reproducible_and_bounded(tmp_path: Path) -> None:
    many = {f"file{i:03d}.txt": "line\n" for i in range(MAX_TOOL_CALLS + 20)}
    cwd = workdir(tmp_path, many)
    first = run_loop([EXEC_COMMAND], LOOK, cwd, 5)
    assert run_loop([EXEC_COMMAND], LOOK, cwd, 5) == first
    assert len(first[0]) <= MAX_TOOL_CALLS


def test_odd_names_are_never_passed_to_the_shell(tmp_path: Path) -> None:
    cwd = workdir(tmp_path, {"ok.txt": "fine\n", "a b;touch x": "no\n", "$(id)": "no\n"})
    for seed in range(5):
        calls, answer = run_loop([EXEC_COMMAND], LOOK, cwd, seed)
        assert [a["cmd"] for _, a in calls] == ["pwd", "ls -p", "cat ok.txt"]
        assert parse_final_answer(answer.text) == 1
    assert not (cwd / "x").exists()


def test_a_new_request_after_an_answer_is_explored_not_the_old_task(tmp_path: Path) -> None:
    answered = [*QUESTION, Message(role="assistant", content="The answer is 82.")]
    for seed in range(10):
        look = [*answered, Message(role="user", content=LOOK)]
        draft = respond_chat(look, tools(BASH), None, 200, random.Random(seed))
        assert draft.tool_call is not None and '"pwd"' in draft.tool_call.arguments
        again = [*answered, Message(role="user", content="And what is 2 + 3?")]
        draft = respond_chat(again, tools(BASH), "required", 200, random.Random(seed))
        assert draft.tool_call is not None and "$((2 + 3))" in draft.tool_call.arguments


def test_asked_for_a_sub_agent_it_delegates_once_and_reports() -> None:
    declared = tools(BASH, READ, AGENT)
    ask = [Message(role="user", content="Use a sub-agent to look around.")]
    draft = respond_chat(ask, declared, None, 500, random.Random(0))
    assert draft.tool_call is not None and draft.tool_call.name == "Agent"
    arguments = json.loads(draft.tool_call.arguments)
    assert arguments["subagent_type"] == "general-purpose" and arguments["description"]
    sub = respond_chat(
        [Message(role="user", content=arguments["prompt"])], declared, None, 500, random.Random(0)
    )
    assert sub.tool_call is not None and json.loads(sub.tool_call.arguments)["command"] == "pwd"
    call = {"id": "c1", "function": draft.tool_call.model_dump()}
    done = [*ask, Message(role="assistant", tool_calls=[call])]
    done.append(Message(role="tool", tool_call_id="c1", content="I read 3 files."))
    final = respond_chat(done, declared, None, 500, random.Random(0))
    assert final.tool_call is None and "I read 3 files." in final.text


def test_calls_the_engine_did_not_make_are_not_read_as_its_progress() -> None:
    """An agent's own earlier calls (an unbalanced quote, another command) neither count as a
    read nor break the engine."""
    made = {"id": "c1", "function": {"name": "Bash", "arguments": '{"command": "cat \'a b"}'}}
    other = {"id": "c2", "function": {"name": "Bash", "arguments": '{"command": "git status"}'}}
    messages = [Message(role="user", content=LOOK)]
    messages += [Message(role="assistant", tool_calls=[made, other])]
    messages += [Message(role="tool", tool_call_id=c, content="x") for c in ("c1", "c2")]
    draft = respond_chat(messages, tools(BASH), None, 200, random.Random(0))
    assert draft.tool_call is not None and '"pwd"' in draft.tool_call.arguments


def test_outputs_are_read_without_the_agents_wrapping() -> None:
    codex = "Chunk ID: 1\nWall time: 0.01 seconds\nProcess exited with code 0\nOutput:\n82\n"
    assert tool_output(codex) == "82\n"
    assert tool_output(json.dumps({"output": "a\nb\n", "metadata": {"exit_code": 0}})) == "a\nb\n"
    assert tool_output("     1\u2192# Demo\n     2\u2192text\n") == "# Demo\ntext\n"
    assert listed_files("README.md\nsrc/\n/abs/notes.txt\nbad name\n") == ["README.md", "notes.txt"]


def test_no_task_without_tools_to_explore_is_the_canned_reply() -> None:
    hello = [Message(role="user", content="Fix the failing test in src/app.py")]
    for declared, choice in (([CALCULATOR_TOOL, BASH], "calculator"), ([READ], "required")):
        draft = respond_chat(hello, tools(*declared), choice, 200, random.Random(0))
        assert (draft.text, draft.tool_call) == (NO_TASK_REPLY, None)


def test_a_long_window_does_not_make_a_ramble_endless() -> None:
    """With 32k tokens of room a ramble stops by itself, well short of the limit."""
    drafts = [respond_chat(QUESTION, [], None, 32_000, random.Random(s)) for s in range(300)]
    rambles = [d for d in drafts if parse_final_answer(d.text) is None]
    assert rambles
    assert all(len(d.text) < 10_000 for d in rambles)
