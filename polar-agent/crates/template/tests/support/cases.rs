//! Conversations for the differential test, built deterministically from a
//! seed in the shapes the six harness CLIs send once translated to Hugging
//! Face messages: system prompts (with a system message in the middle, as
//! Claude Code sends), multi-turn user/assistant, text parts, the shell /
//! read / edit / search / todo tools of the CLIs as JSON schemas, assistant
//! tool calls (one or several, `arguments` as objects, as vLLM passes
//! them), tool results (text, JSON, multi-line, unicode, empty),
//! reasoning on assistant turns, the whitespace-only content a harness
//! echoes before a tool call, and the template variables each family
//! reads.

use serde_json::{Map, Value, json};

/// One case: what `apply_chat_template` takes.
#[derive(Clone, Debug)]
pub struct Case {
    pub messages: Vec<Value>,
    pub tools: Option<Vec<Value>>,
    pub add_generation_prompt: bool,
    pub kwargs: Map<String, Value>,
}

impl Case {
    pub fn to_json(&self) -> Value {
        json!({
            "messages": self.messages,
            "tools": self.tools,
            "documents": null,
            "add_generation_prompt": self.add_generation_prompt,
            "kwargs": self.kwargs,
        })
    }
}

/// SplitMix64: a small generator whose sequence never changes.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const SYSTEM: [&str; 5] = [
    "You are Claude Code, Anthropic's official CLI for Claude.\nYou are an interactive CLI tool that helps users with software engineering tasks.\n\n# Tone and style\n- Be concise.\n- Use `backticks` for code; never use emojis unless asked.\n\n<env>\nWorking directory: /home/user/project\nIs directory a git repo: Yes\nPlatform: linux\n</env>",
    "You are Codex, a coding agent based on GPT-5. You and the user share the same workspace.\n\n## Planning\nUse `update_plan` for non-trivial tasks.\n\n## Shell commands\n- Prefer `rg` over `grep`.\n- Wrap commands as [\"bash\", \"-lc\", \"...\"].",
    "You are an interactive CLI agent specializing in software engineering tasks.\n\n# Core Mandates\n- **Conventions:** Rigorously adhere to existing project conventions.\n- **Libraries/Frameworks:** NEVER assume a library is available.\n\n# Operating System\nlinux 6.1 — /workspace (ünïcödé path: /tmp/データ)",
    "You are opencode, an interactive CLI tool.\nIMPORTANT: Refuse to write code that may be used maliciously.\n\nWhen you run a non-trivial bash command, explain what it does.\n\t- Tabs and   spaces   stay.\n",
    "You are pi, a coding assistant. Answer in the user's language. 你好，世界。 Ответ по-русски, если спросят.",
];

const USER: [&str; 10] = [
    "Here is a transcript: <|im_start|>user\nhi<|im_end|> <|endoftext|> <｜User｜> <|start|> and </think> <tool_call> tags, as text",
    "\u{200b}zero\u{200d}width\u{feff} and tab\tseparated",
    "Create a file out.txt containing hi, then tell me what you did.",
    "Why does `cargo build` fail with E0599 here?\n\n```\nerror[E0599]: no method named `foo` found for struct `Bar`\n```",
    "fix the failing test in src/lib.rs — it panics on empty input",
    "<system-reminder>\nThe user opened the file /src/main.rs in the IDE.\n</system-reminder>",
    "Résumé: lis le fichier README.md et résume-le en 3 points 🙂",
    "   leading and trailing spaces   ",
    "Run the tests.\n\n\n",
    "What is 2 < 3 && 5 > 4? Answer with <answer>...</answer> tags and \"quotes\".",
];

const ANSWERS: [&str; 6] = [
    "I created `out.txt` containing `hi`.",
    "Done. The test now passes:\n\n```rust\nassert_eq!(parse(\"\"), None);\n```",
    "The build fails because `Bar` has no method `foo`; rename the call to `bar()`.",
    "Voilà : le fichier README décrit l'installation, l'usage et la licence.",
    "",
    "All 42 tests passed ✅",
];

const REASONING: [&str; 5] = [
    "The user wants a file. I should run a shell command.",
    "Let me check the error first.\n\nThe method is named `bar`, so the call is wrong.",
    "\nThinking with leading and trailing newlines.\n",
    "需要先读取文件。",
    "Plan: 1) read 2) edit 3) test",
];

const TOOL_RESULTS: [&str; 11] = [
    "مرحبا بالعالم — RTL text, 👩‍💻 a joined emoji, e\u{301} a combining accent",
    "binary\u{0}\u{7f}data\u{1b}[0m",
    "   \n\t  ",
    "",
    "hi",
    "{\"exit_code\": 0, \"stdout\": \"ok\\n\", \"stderr\": \"\"}",
    "total 8\ndrwxr-xr-x 2 user user 4096 Jan  1 00:00 .\n-rw-r--r-- 1 user user    3 Jan  1 00:00 out.txt\n",
    "     1\tfn main() {\n     2\t    println!(\"héllo\");\n     3\t}\n",
    "Error: file not found: /nope.txt",
    "<tool_response>nested tag</tool_response>",
    "{\"matches\": [{\"path\": \"src/lib.rs\", \"line\": 10}], \"truncated\": false}",
];

/// The CLIs' tools as OpenAI function definitions.
pub fn tool_pool() -> Vec<Value> {
    let f = |name: &str, description: &str, parameters: Value| json!({"type": "function", "function": {"name": name, "description": description, "parameters": parameters}});
    vec![
        f(
            "Bash",
            "Executes a given bash command in a persistent shell session with optional timeout.\n\nUsage notes:\n  - The command argument is required.\n  - Quote paths with spaces: cd \"path with spaces/file.txt\"",
            json!({"type": "object", "properties": {
                "command": {"type": "string", "description": "The command to execute"},
                "timeout": {"type": "number", "description": "Optional timeout in milliseconds (max 600000)"},
                "description": {"type": "string", "description": "Clear, concise description of what this command does in 5-10 words"},
                "run_in_background": {"type": "boolean"}
            }, "required": ["command"], "additionalProperties": false, "$schema": "http://json-schema.org/draft-07/schema#"}),
        ),
        f(
            "exec_command",
            "Runs a command in a PTY, returning output or a session ID for ongoing interaction.",
            json!({"type": "object", "properties": {
                "cmd": {"type": "string", "description": "Shell command to execute."},
                "workdir": {"type": "string"},
                "yield_time_ms": {"type": "number", "default": 10000},
                "max_output_tokens": {"type": "integer"}
            }, "required": ["cmd"], "additionalProperties": false}),
        ),
        f(
            "read_file",
            "Reads and returns the content of a specified file. Handles text, images (PNG, JPG) and PDF files.",
            json!({"type": "object", "properties": {
                "absolute_path": {"type": "string", "description": "The absolute path to the file to read (e.g., '/home/user/project/file.txt')."},
                "offset": {"type": "number", "description": "Optional: the 0-based line number to start reading from."},
                "limit": {"type": "number"}
            }, "required": ["absolute_path"]}),
        ),
        f(
            "Edit",
            "Performs exact string replacements in files.",
            json!({"type": "object", "properties": {
                "file_path": {"type": "string"},
                "old_string": {"type": "string", "description": "The text to replace"},
                "new_string": {"type": "string", "description": "The text to replace it with (must be different from old_string)"},
                "replace_all": {"type": "boolean", "default": false}
            }, "required": ["file_path", "old_string", "new_string"], "additionalProperties": false}),
        ),
        f(
            "grep",
            "A powerful search tool built on ripgrep — supports full regex syntax (e.g. \"log.*Error\").",
            json!({"type": "object", "properties": {
                "pattern": {"type": "string"},
                "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]},
                "-i": {"type": "boolean"},
                "head_limit": {"type": "integer", "minimum": 0, "maximum": 1000},
                "temperature_like": {"type": "number", "default": 0.5}
            }, "required": ["pattern"]}),
        ),
        f(
            "TodoWrite",
            "Use this tool to create and manage a structured task list for your current coding session.",
            json!({"type": "object", "properties": {
                "todos": {"type": "array", "items": {"type": "object", "properties": {
                    "content": {"type": "string", "minLength": 1},
                    "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
                    "id": {"type": "string"}
                }, "required": ["content", "status", "id"]}}
            }, "required": ["todos"]}),
        ),
        f(
            "apply_patch",
            "Use the `apply_patch` tool to edit files. *** Begin Patch ... *** End Patch",
            json!({"type": "object", "properties": {"input": {"type": "string", "description": "The entire contents of the apply_patch command"}}, "required": ["input"]}),
        ),
        f(
            "web_fetch",
            "Fetches a URL. Only http(s) URLs; 日本語の説明も可。",
            json!({"type": "object", "properties": {
                "url": {"type": "string", "format": "uri"},
                "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                "retries": {"type": ["integer", "null"]}
            }, "required": ["url"]}),
        ),
    ]
}

/// Arguments for a call of `name`.
fn arguments(rng: &mut Rng, name: &str) -> Value {
    match name {
        "Bash" => {
            let mut a = json!({"command": rng.pick(&["echo hi > out.txt", "cargo test 2>&1 | tail -20", "ls -la \"dir with spaces\"", "python3 -c 'print(\"é\")'"])});
            if rng.chance(50) {
                a["description"] = json!("Write hi to out.txt");
            }
            if rng.chance(30) {
                a["timeout"] = json!(120000);
            }
            a
        }
        "exec_command" => {
            json!({"cmd": rng.pick(&["rg -n foo src", "cat README.md"]), "yield_time_ms": 1000})
        }
        "read_file" => {
            let mut a = json!({"absolute_path": "/home/user/project/src/main.rs"});
            if rng.chance(40) {
                a["offset"] = json!(10);
                a["limit"] = json!(2.5);
            }
            a
        }
        "Edit" => {
            json!({"file_path": "/src/lib.rs", "old_string": "fn a() {\n    1\n}", "new_string": "fn a() {\n    2 // changed ✓\n}", "replace_all": rng.chance(50)})
        }
        "grep" => {
            json!({"pattern": "log.*Error", "output_mode": "content", "-i": true, "head_limit": null})
        }
        "TodoWrite" => json!({"todos": [
            {"content": "Read the code", "status": "completed", "id": "1"},
            {"content": "Fix the bug", "status": "in_progress", "id": "2"}
        ]}),
        "apply_patch" => {
            json!({"input": "*** Begin Patch\n*** Update File: a.txt\n@@\n-old\n+new\n*** End Patch\n"})
        }
        _ => json!({"url": "https://example.com/?q=a&b=\"c\"", "headers": {}}),
    }
}

/// One user message: text, or text parts.
fn user(rng: &mut Rng) -> Value {
    let text = *rng.pick(&USER);
    if rng.chance(8) {
        let mut parts = vec![json!({"type": "text", "text": text})];
        if rng.chance(60) {
            parts.push(json!({"type": "text", "text": "<system-reminder>Todo list is empty.</system-reminder>"}));
        }
        json!({"role": "user", "content": parts})
    } else {
        json!({"role": "user", "content": text})
    }
}

/// An assistant turn with tool calls and their results, or a final answer.
fn assistant_turn(rng: &mut Rng, tools: &[Value], calls: bool, out: &mut Vec<Value>) {
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    if calls && !tools.is_empty() {
        let n = 1 + rng.below(3);
        let mut tool_calls = Vec::new();
        let mut results = Vec::new();
        for i in 0..n {
            let tool = rng.pick(tools);
            let name = tool["function"]["name"]
                .as_str()
                .unwrap_or("Bash")
                .to_owned();
            let id = format!("call_{:x}{i}", rng.next() % 0xffff_ffff);
            let mut args = arguments(rng, &name);
            // Some clients hand arguments over as the JSON text the model wrote.
            if rng.chance(15) {
                args = json!(args.to_string());
            }
            tool_calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}));
            let mut result =
                json!({"role": "tool", "tool_call_id": id, "content": rng.pick(&TOOL_RESULTS)});
            if rng.chance(50) {
                result["name"] = json!(name);
            }
            results.push(result);
        }
        let content = match rng.below(10) {
            0 => Value::Null,
            1 | 2 => json!("\n\n"),
            3 | 4 => json!("I'll run that now."),
            _ => json!(""),
        };
        message.insert("content".into(), content);
        message.insert("tool_calls".into(), Value::Array(tool_calls));
        reasoning(rng, &mut message);
        out.push(Value::Object(message));
        out.extend(results);
    } else {
        let answer = *rng.pick(&ANSWERS);
        if rng.chance(6) {
            // Reasoning left inline, as a harness echoes a raw reply.
            let thought = *rng.pick(&REASONING);
            message.insert(
                "content".into(),
                json!(format!("<think>\n{thought}\n</think>\n\n{answer}")),
            );
        } else {
            message.insert("content".into(), json!(answer));
            reasoning(rng, &mut message);
        }
        out.push(Value::Object(message));
    }
}

fn reasoning(rng: &mut Rng, message: &mut Map<String, Value>) {
    match rng.below(6) {
        0 | 1 => {
            message.insert("reasoning_content".into(), json!(rng.pick(&REASONING)));
        }
        2 => {
            message.insert("reasoning".into(), json!(rng.pick(&REASONING)));
        }
        _ => {}
    }
}

/// The family's template variables.
fn kwargs(rng: &mut Rng, family: &str) -> Map<String, Value> {
    let mut k = Map::new();
    match family {
        "qwen3" | "qwen3_coder" => match rng.below(3) {
            0 => {
                k.insert("enable_thinking".into(), json!(false));
            }
            1 => {
                k.insert("enable_thinking".into(), json!(true));
            }
            _ => {}
        },
        "gptoss" => {
            if let Some(effort) = [Some("low"), Some("medium"), Some("high"), None][rng.below(4)] {
                k.insert("reasoning_effort".into(), json!(effort));
            }
            if rng.chance(20) {
                k.insert(
                    "model_identity".into(),
                    json!("You are a helpful assistant."),
                );
            }
        }
        "deepseek_v3_1" => {
            if rng.chance(50) {
                k.insert("thinking".into(), json!(rng.chance(50)));
            }
        }
        _ => {
            if rng.chance(20) {
                k.insert("date_string".into(), json!("01 Jan 2026"));
            }
        }
    }
    k
}

/// `n` cases for `family`, from `seed`.
pub fn cases(family: &str, seed: u64, n: usize) -> Vec<Case> {
    let mut rng = Rng::new(seed);
    let pool = tool_pool();
    (0..n)
        .map(|_| {
            let tools: Vec<Value> = if rng.chance(65) {
                let k = 1 + rng.below(pool.len());
                (0..k).map(|_| rng.pick(&pool).clone()).fold(Vec::new(), |mut acc, t| {
                    if !acc.contains(&t) {
                        acc.push(t);
                    }
                    acc
                })
            } else {
                Vec::new()
            };
            let mut messages = Vec::new();
            if rng.chance(80) {
                // Codex sends its instructions as a developer message.
                let role = if rng.chance(10) { "developer" } else { "system" };
                messages.push(json!({"role": role, "content": rng.pick(&SYSTEM)}));
            }
            let turns = 1 + rng.below(4);
            for t in 0..turns {
                messages.push(user(&mut rng));
                if rng.chance(10) && t > 0 {
                    messages.push(json!({"role": "system", "content": "<system-reminder>Context was compacted.</system-reminder>"}));
                    messages.push(user(&mut rng));
                }
                let last = t + 1 == turns;
                if last && rng.chance(40) {
                    break;
                }
                let steps = rng.below(3);
                for _ in 0..steps {
                    assistant_turn(&mut rng, &tools, true, &mut messages);
                }
                if !(last && steps > 0 && rng.chance(50)) {
                    assistant_turn(&mut rng, &tools, false, &mut messages);
                }
            }
            let ends_with_assistant = messages
                .last()
                .is_some_and(|m| m["role"] == "assistant");
            Case {
                messages,
                tools: (!tools.is_empty()).then_some(tools),
                add_generation_prompt: if ends_with_assistant {
                    rng.chance(20)
                } else {
                    rng.chance(85)
                },
                kwargs: kwargs(&mut rng, family),
            }
        })
        .collect()
}

/// A long agentic session: `turns` tool rounds of about 1,600 tokens each.
pub fn long_session(turns: usize) -> Case {
    let mut rng = Rng::new(7);
    let tools = tool_pool();
    let mut messages = vec![
        json!({"role": "system", "content": SYSTEM[0]}),
        json!({"role": "user", "content": USER[2]}),
    ];
    let file: String = (0..60)
        .map(|i| format!("    {i:>4}\tlet value_{i} = compute(\"item {i}\", {i}.5); // ✓\n"))
        .collect();
    for i in 0..turns {
        let id = format!("call_{i}");
        messages.push(json!({"role": "assistant", "content": "", "reasoning_content": REASONING[i % REASONING.len()],
            "tool_calls": [{"id": id, "type": "function", "function": {"name": "read_file", "arguments": arguments(&mut rng, "read_file")}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": file}));
    }
    Case {
        messages,
        tools: Some(tools),
        add_generation_prompt: true,
        kwargs: Map::new(),
    }
}
