"""The reference for polar-template's differential test: renders and
tokenizes chat cases with transformers' `apply_chat_template`.

Usage: reference.py MODEL_DIR CASES_JSON OUT_JSON [MODEL_DIR CASES_JSON OUT_JSON ...]

CASES_JSON is a list of {"messages", "tools", "documents",
"add_generation_prompt", "kwargs"}; OUT_JSON gets, per case, {"text",
"ids", "decoded", "decoded_skip"} (the ids decoded with and without special
tokens) or {"error": "<exception type>: <message>"}. Offline: the tokenizer
and template are read from MODEL_DIR only.
"""

import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from transformers import AutoTokenizer  # noqa: E402


def render(tokenizer, case):
    kwargs = dict(
        tools=case.get("tools"),
        documents=case.get("documents"),
        add_generation_prompt=case["add_generation_prompt"],
        **case.get("kwargs", {}),
    )
    try:
        text = tokenizer.apply_chat_template(case["messages"], tokenize=False, **kwargs)
        ids = tokenizer.apply_chat_template(case["messages"], tokenize=True, return_dict=False, **kwargs)
    except Exception as e:  # the template's refusal is a result to compare
        return {"error": f"{type(e).__name__}: {e}"}
    ids = list(ids)
    return {
        "text": text,
        "ids": ids,
        "decoded": tokenizer.decode(ids),
        "decoded_skip": tokenizer.decode(ids, skip_special_tokens=True),
    }


def main():
    args = sys.argv[1:]
    if not args or len(args) % 3:
        sys.exit(__doc__)
    for model_dir, cases_path, out_path in zip(args[0::3], args[1::3], args[2::3]):
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        with open(cases_path, encoding="utf-8") as f:
            cases = json.load(f)
        results = [render(tokenizer, case) for case in cases]
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump(results, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
