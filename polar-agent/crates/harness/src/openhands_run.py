"""OpenHands' agent for one task, as the `openhands` preset runs it.

openhands-sdk is a library with no program of its own: this runs its default
agent (`openhands.tools.preset.default.get_default_agent` in CLI mode: the
terminal, file editor and task tracker tools, no browser; the terminal on
plain subprocesses) on the instruction
given as the first argument, in the current directory, until the agent calls
its `finish` tool. The model is LiteLLM's `openai/polar-model`, reached at
`api.openai.com` (transparent mode) or at `OPENAI_BASE_URL` (base-URL mode).
Polar writes this file into the sandbox's HOME; it is not the SDK's and
changes none of its behaviour.
"""

import os
import sys

from openhands.sdk import LLM, Conversation, Tool
from openhands.tools.preset.default import get_default_agent
from openhands.tools.terminal import TerminalTool
from pydantic import SecretStr


def main() -> int:
    llm = LLM(
        model="openai/polar-model",
        api_key=SecretStr(os.environ["OPENAI_API_KEY"]),
        base_url=os.environ.get("OPENAI_BASE_URL"),
        usage_id="agent",
    )
    agent = get_default_agent(llm=llm, cli_mode=True)
    # Its terminal on plain subprocesses: with tmux on the node the SDK
    # picks tmux, whose server does not start in the sandbox.
    tools = [
        Tool(name=t.name, params={**t.params, "terminal_type": "subprocess"})
        if t.name == TerminalTool.name
        else t
        for t in agent.tools
    ]
    agent = agent.model_copy(update={"tools": tools})
    conversation = Conversation(agent=agent, workspace=os.getcwd())
    conversation.send_message(sys.argv[1])
    conversation.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
