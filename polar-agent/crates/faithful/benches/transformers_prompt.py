"""The whole-conversation prompt in transformers, for the `prompt` bench.

Reads {"model_dir", "runs", "conversations": [{"label", "messages",
"tools"}]} on stdin; for each conversation, times `runs` times
`apply_chat_template(tokenize=False, add_generation_prompt=True)` followed
by `encode(add_special_tokens=False)` (what a server does with a chat
request) and prints one JSON line per conversation: label, tokens, and
each run's seconds.
"""

import json
import sys
import time

from transformers import AutoTokenizer


def main():
    job = json.load(sys.stdin)
    tokenizer = AutoTokenizer.from_pretrained(job["model_dir"])
    for conv in job["conversations"]:
        seconds = []
        tokens = 0
        for _ in range(job["runs"]):
            start = time.perf_counter()
            text = tokenizer.apply_chat_template(
                conv["messages"], tools=conv["tools"], tokenize=False, add_generation_prompt=True
            )
            tokens = len(tokenizer.encode(text, add_special_tokens=False))
            seconds.append(time.perf_counter() - start)
        print(json.dumps({"label": conv["label"], "tokens": tokens, "seconds": seconds}), flush=True)


if __name__ == "__main__":
    main()
