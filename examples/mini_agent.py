#!/usr/bin/env python3
"""A tiny coding agent for Polar's demo and tests: it talks to the real
Anthropic Messages endpoint (hard-coded, as real harnesses do), offers one
`bash` tool, runs the commands the model asks for in the current directory,
and stops when the model answers without a tool call (at most 8 turns).

Inside a Polar sandbox the connection is redirected to the agent, whose CA
the sandbox trusts; outside one it would reach Anthropic (and fail without a
key). Standard library only.
"""

import json
import os
import ssl
import subprocess
import sys
import urllib.request

URL = "https://api.anthropic.com/v1/messages"
TOOLS = [{
    "name": "bash",
    "description": "Run a shell command in the workspace and return its output.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}]


def call(messages):
    body = json.dumps({
        "model": "claude-sonnet-4-5",
        "max_tokens": 512,
        "tools": TOOLS,
        "messages": messages,
    }).encode()
    req = urllib.request.Request(URL, data=body, method="POST", headers={
        "content-type": "application/json",
        "anthropic-version": "2023-06-01",
        "x-api-key": os.environ.get("ANTHROPIC_API_KEY", "none"),
    })
    with urllib.request.urlopen(req, timeout=120, context=ssl.create_default_context()) as r:
        return json.load(r)


def main():
    instruction = " ".join(sys.argv[1:]) or os.environ.get("POLAR_INSTRUCTION", "Say hello.")
    messages = [{"role": "user", "content": instruction}]
    for turn in range(8):
        reply = call(messages)
        messages.append({"role": "assistant", "content": reply["content"]})
        uses = [b for b in reply["content"] if b.get("type") == "tool_use"]
        for b in reply["content"]:
            if b.get("type") == "text" and b.get("text"):
                print(f"[turn {turn}] model: {b['text']}")
        if not uses:
            return 0
        results = []
        for u in uses:
            cmd = u.get("input", {}).get("command", "")
            print(f"[turn {turn}] $ {cmd}")
            p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
            results.append({
                "type": "tool_result",
                "tool_use_id": u["id"],
                "content": (p.stdout + p.stderr)[-4000:] or f"(exit {p.returncode})",
                "is_error": p.returncode != 0,
            })
        messages.append({"role": "user", "content": results})
    print("gave up after 8 turns", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
