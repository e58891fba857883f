#!/usr/bin/env python3
"""Summary of a real-model sweep (tests/real_model.sh): per agent, what the tasks did, and what
the model's answers were, read from the result rows and each task's gateway transcript.

Usage: real_model_summary.py --model M --server S --server-log LOG [--wheel-build-s N]
       [--gateway-bench BENCH.json] [--wall FILE]... RESULTS.jsonl...

Prints one JSON object. Answer kinds are read off the wire, per call, one kind each, first match:
  context_length_error  HTTP 400 whose error says the context window was exceeded
  other_error           any other non-2xx answer (after the gateway's retries)
  empty                 no text and no tool call
  truncated             finish_reason "length" (cut at max_tokens or at the context's end)
  garbage               a tool call naming no offered tool, or whose arguments are not a JSON object
  format_ignored        tools were offered and none was called, or none were offered and the text
                        holds neither a fenced block nor a JSON object (what every agent here asks for)
  well_formed           the rest
"""

import argparse
import json
import os
import re
import sys
from collections import defaultdict

KINDS = ["well_formed", "format_ignored", "garbage", "truncated", "empty",
         "context_length_error", "other_error"]


def is_context_length_error(status, body):
    if status != 400 or not isinstance(body, dict):
        return False
    err = body.get("error") or {}
    if not isinstance(err, dict):
        return False
    if err.get("code") == "context_length_exceeded":
        return True
    message = str(err.get("message", "")).lower()
    return "context length" in message or "context window" in message


def has_json_object(text):
    for start in (m.start() for m in re.finditer(r"\{", text)):
        depth = 0
        for end in range(start, len(text)):
            c = text[end]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    try:
                        if isinstance(json.loads(text[start:end + 1]), dict):
                            return True
                    except ValueError:
                        pass
                    break
    return False


def message_of(response):
    """The assistant message and finish_reason of a response (a body, or a list of stream chunks)."""
    if isinstance(response, list):
        content, calls, finish = "", {}, None
        for chunk in response:
            choice = (chunk.get("choices") or [{}])[0] if isinstance(chunk, dict) else {}
            delta = choice.get("delta") or {}
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc.get("index", 0), {"function": {"name": "", "arguments": ""}})
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
        return {"content": content, "tool_calls": list(calls.values())}, finish
    choice = ((response or {}).get("choices") or [{}])[0] if isinstance(response, dict) else {}
    return choice.get("message") or {}, choice.get("finish_reason")


def answer_kind(line):
    status, response, request = line.get("status", 0), line.get("response"), line.get("request") or {}
    if status // 100 != 2:
        return "context_length_error" if is_context_length_error(status, response) else "other_error"
    message, finish = message_of(response)
    text = message.get("content") or ""
    calls = message.get("tool_calls") or []
    if not text.strip() and not calls:
        return "empty"
    if finish == "length":
        return "truncated"
    offered = {((t.get("function") or {}).get("name")) for t in request.get("tools") or []}
    for call in calls:
        fn = call.get("function") or {}
        try:
            args_ok = isinstance(json.loads(fn.get("arguments") or ""), dict)
        except ValueError:
            args_ok = False
        if fn.get("name") not in offered or not args_ok:
            return "garbage"
    if offered and not calls:
        return "format_ignored"
    if not offered and "```" not in text and not has_json_object(text):
        return "format_ignored"
    return "well_formed"


def read_json(path):
    """A JSON file's value, or None when it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def outcome_of(row):
    """How one task ended: "resolved", "verdict" (graded, not resolved), "agent_failure" or
    "infra_error", read off its result row."""
    error_class = row.get("error_class") or ""
    if error_class.startswith("infra:"):
        return "infra_error"
    if error_class:
        return "agent_failure"
    return "resolved" if row.get("success") else "verdict"


def server_usage(line):
    """The server's own usage of one call: (prompt_tokens, completion_tokens), 0 when it sent none."""
    response = line.get("response")
    usage = None
    if isinstance(response, dict):
        usage = response.get("usage")
    elif isinstance(response, list):
        for chunk in response:
            if isinstance(chunk, dict) and chunk.get("usage"):
                usage = chunk["usage"]
    usage = usage or {}
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


def tokens_per_s(server_log):
    """Generation speed from llama.cpp's timing lines ("eval time = ... tokens per second")."""
    speeds = []
    try:
        for line in open(server_log, errors="replace"):
            if re.search(r"(?<!prompt )eval time", line):
                m = re.search(r"([0-9.]+) tokens per second", line)
                if m:
                    speeds.append(float(m.group(1)))
    except OSError:
        return None
    if not speeds:
        return None
    speeds.sort()
    return round(speeds[len(speeds) // 2], 1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--server", required=True)
    p.add_argument("--server-log", required=True)
    p.add_argument("--wheel-build-s", type=int, default=0)
    p.add_argument("--server-restarts", type=int, default=0, help="times the model server crashed and was restarted")
    p.add_argument("--gateway-bench", help="`bench gateway --json` output against the same server")
    p.add_argument("--wall", action="append", default=[], help="a file holding a sweep's wall seconds (repeatable)")
    p.add_argument("results", nargs="+")
    a = p.parse_args()

    agents = {}
    outcomes = []
    mismatches = []
    tasks_without_transcript = []
    calls_not_transcribed = []
    for path in a.results:
        for raw in open(path):
            row = json.loads(raw)
            name = row["agent"] if row.get("variant") in (None, "", "full") else f"{row['agent']}:{row['variant']}"
            if row["agent"] in ("gold", "gold-trace"):
                continue
            ag = agents.setdefault(name, {"tasks": 0, "successes": 0, "agent_failures": 0, "infra_errors": 0,
                                          "retried_attempts": 0, "llm_calls": 0, "tokens_in": 0,
                                          "tokens_out": 0, "wall_s": 0.0, "error_classes": defaultdict(int),
                                          "answers": {k: 0 for k in KINDS}})
            ag["tasks"] += 1
            ag["successes"] += bool(row.get("success"))
            error_class = row.get("error_class") or ""
            report = read_json(os.path.join(row.get("artifact_path") or "", "report.json")) or {}
            outcomes.append({"instance_id": row["instance_id"], "agent": name,
                             "outcome": outcome_of(row), "verdict": row.get("verdict"),
                             "error_class": error_class or None,
                             "test_patch": report.get("patch_exists"),
                             "patch_applied": report.get("patch_successfully_applied"),
                             "stopped_by": (report.get("agent") or {}).get("stopped_by"),
                             "llm_calls": int(row.get("llm_calls") or 0),
                             "wall_s": round(float(row.get("wall_s") or 0.0), 1)})
            if error_class.startswith("infra:"):
                ag["infra_errors"] += 1
            elif error_class:
                ag["agent_failures"] += 1
            if error_class:
                ag["error_classes"][error_class] += 1
            ag["retried_attempts"] += max(0, int(row.get("attempts") or 1) - 1)
            ag["llm_calls"] += int(row.get("llm_calls") or 0)
            ag["tokens_in"] += int(row.get("tokens_in") or 0)
            ag["tokens_out"] += int(row.get("tokens_out") or 0)
            ag["wall_s"] += float(row.get("wall_s") or 0.0)
            transcript = os.path.join(row.get("artifact_path") or "", "transcript.jsonl")
            if not os.path.isfile(transcript):
                if int(row.get("llm_calls") or 0) > 0:
                    tasks_without_transcript.append(f"{row['instance_id']} {name}")
                continue
            # llm_calls counts the calls the model answered; a refused call (a context-length
            # error) is transcribed too but charged nothing.
            calls, prompt, completion = 0, 0, 0
            for tl in open(transcript):
                line = json.loads(tl)
                calls += int(line.get("status", 0)) // 100 == 2
                ag["answers"][answer_kind(line)] += 1
                pt, ct = server_usage(line)
                prompt += pt
                completion += ct
            if calls != int(row.get("llm_calls") or 0):
                calls_not_transcribed.append({"task": f"{row['instance_id']} {name}",
                                              "llm_calls": row.get("llm_calls"), "answered_in_transcript": calls})
            metered = (int(row.get("tokens_in") or 0), int(row.get("tokens_out") or 0))
            if metered != (prompt, completion):
                mismatches.append({"task": f"{row['instance_id']} {name}", "metered": metered,
                                   "server": (prompt, completion), "transcript_calls": calls,
                                   "llm_calls": row.get("llm_calls")})
    for ag in agents.values():
        ag["wall_s"] = round(ag["wall_s"], 1)
        ag["error_classes"] = dict(ag["error_classes"])
        ag.update(ag.pop("answers"))
    out = {
        "model": a.model,
        "server": a.server,
        "large_model": False,
        "server_restarts": a.server_restarts,
        "metered_equals_server_usage": not mismatches and not tasks_without_transcript,
        "usage_mismatches": mismatches,
        "tasks_without_transcript": tasks_without_transcript,
        "transcripts_hold_every_call": not calls_not_transcribed and not tasks_without_transcript,
        "calls_not_transcribed": calls_not_transcribed,
        "server_tokens_per_s": tokens_per_s(a.server_log),
        "wheel_build_s": a.wheel_build_s,
        "sweep_wall_s": sum(int(open(w).read().strip() or 0) for w in a.wall),
        "gateway_bench": json.load(open(a.gateway_bench)) if a.gateway_bench else None,
        "tasks": sum(ag["tasks"] for ag in agents.values()),
        "infra_errors": sum(ag["infra_errors"] for ag in agents.values()),
        "agents": agents,
        "task_outcomes": sorted(outcomes, key=lambda o: (o["instance_id"], o["agent"])),
    }
    json.dump(out, sys.stdout, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
