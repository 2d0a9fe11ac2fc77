// The dashboard in real browsers (`cargo xtask test`, step "dashboard in
// chromium and firefox"; xtask/src/dashboard.rs starts the stack and sets
// the environment): each browser of POLAR_BROWSERS in turn, headless
// (Debian's chromium driven by playwright-core, Debian's firefox-esr by
// puppeteer-core over WebDriver BiDi: driver.mjs), against a mock backend,
// a rollout server and a gateway node on loopback. Each runs every check,
// in order:
//   1. the token is asked for once and kept in sessionStorage, never in a
//      URL; a viewer token shows no control;
//   2. the overview follows a task of the mini agent to its end live (the
//      event stream; the page is never reloaded) with its node's pools;
//   3. the task page lists the samples, and its filters work; a running
//      session's timeline shows its calls live, as they end (the event
//      stream's `calls` events), then the result's list;
//   4. a session's timeline has one row per call its result lists, each
//      with its queue (received to sent) apart from its TTFT, and its
//      trajectory's colouring matches the loss mask of the exported file
//      (read from disk here, not from the server) for every token, and
//      its token text (the server's tokenizer: the mock's own vocabulary,
//      `polar mock-backend --write-tokenizer`) concatenated over each
//      call's generated tokens, and over the whole trace, is what the mock
//      decodes those ids to (its `/detokenize`);
//   4b. once its node dropped its copy, the session's calls are read from
//      the exported calls file: one entry per call, the same calls as the
//      exported rows (read from disk here), each with the native request
//      the harness sent and the reply;
//   5. the logprob heat (each trained token's step from its exported
//      logprob), the per_request view, two samples side by side;
//   6. a trainer token's pause and resume (with a policy version) reach the
//      node and show on the overview;
//   7. a 200,000-token trace (a node played by this script hands the server
//      its result) opens and scrolls end to end within the bounds below,
//      its colouring checked where it scrolls; the times go to
//      POLAR_MEASUREMENTS, per browser (BENCHMARKS.md quotes them).
// The first browser's screenshots go to POLAR_SCREENSHOTS. Every wait is
// bounded.

import { existsSync, readFileSync, readdirSync, writeFileSync, mkdirSync } from "node:fs";
import { createServer } from "node:http";
import { join } from "node:path";
import { launch } from "./driver.mjs";

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set (cargo xtask test sets it)`);
  return v;
};
const SERVER = env("POLAR_SERVER");
const MOCK = env("POLAR_MOCK");
const TRAINER = env("POLAR_TRAINER_TOKEN");
const VIEWER = env("POLAR_VIEWER_TOKEN");
const NODE = env("POLAR_NODE_ID");
const FAKE = env("POLAR_FAKE_NODE_ID");
const FAKE_TOKEN = env("POLAR_FAKE_NODE_TOKEN");
const EXPORT = env("POLAR_EXPORT_DIR");
const WORK = env("POLAR_WORK_DIR");
const SHOTS = env("POLAR_SCREENSHOTS");
const MODULES = env("POLAR_DASHBOARD_MODULES");
/** The browsers, in order, and each one's executable; the first takes the screenshots. */
const BROWSERS = env("POLAR_BROWSERS").split(",").map((kind) => ({
  kind,
  executable: env(`POLAR_${kind.toUpperCase()}`),
}));

/** The bounds this test states (generous: a shared 2-core machine). */
const BIG_TOKENS = 200000;
const BIG_OPEN_LIMIT_MS = 30000;
const BIG_SCROLL_LIMIT_MS = 60000;
const BIG_SCROLL_STEPS = 60;
const TASK_LIMIT_MS = 240000;
/** How long the live task's harness sleeps after its last call. */
const LIVE_SLEEP_SECS = 12;

const measurements = {};
const log = (...a) => console.log("[dashboard]", ...a);
function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

async function rest(path, { token = TRAINER, method = "GET", body } = {}) {
  const resp = await fetch(`${SERVER}${path}`, {
    method,
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await resp.text();
  if (!resp.ok) throw new Error(`${method} ${path}: ${resp.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

async function until(what, limitMs, f) {
  const end = Date.now() + limitMs;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > end) throw new Error(`${what}: not within ${limitMs} ms`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

function submitMiniAgent(taskId, n, command = "python3 /workspace/mini_agent.py", evaluator = { kind: "command", options: { command: "test -s polar-demo.txt" } }) {
  return rest("/v1/tasks", {
    method: "POST",
    body: {
      task_id: taskId,
      instruction: "Create the file polar-demo.txt.",
      num_samples: n,
      timeout_secs: 180,
      runtime: { prepare: [{ upload: { from: env("POLAR_MINI_AGENT"), to: "mini_agent.py" } }] },
      agent: { harness: "shell", options: { command } },
      builder: { kind: "prefix_merging" },
      evaluator,
      metadata: { group_id: taskId, policy_version: "w-1" },
    },
  });
}

/** The exported JSONL rows of a session, read from disk. */
function exportedRows(taskId, session) {
  const dir = join(EXPORT, `task=${taskId}`);
  const file = readdirSync(dir).find((f) => f === `${session}.jsonl`);
  check(file, `${session}.jsonl exported in ${dir}`);
  return readFileSync(join(dir, file), "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l)).sort((a, b) => a.trace_index - b.trace_index);
}

/** Every rendered token cell in the trajectory's grid: [index, class]. */
async function renderedCells(page, scope = "#trajectory") {
  // One string across the wire: WebDriver BiDi serializes nested arrays
  // value by value, which costs Firefox seconds per scroll step.
  return JSON.parse(await page.$$eval(`${scope} .tokscroll .tok[data-i]`, (els) => JSON.stringify(els.map((e) => [Number(e.dataset.i), e.className]))));
}

/**
 * The bytes each rendered text cell stands for: [index, bytes | null (a
 * cell without text)]. Text nodes and whitespace marks hold the token's
 * exact text; a partial character's bytes are in data-bytes.
 */
async function renderedBytes(page, scope = "#trajectory") {
  return JSON.parse(await page.$$eval(`${scope} .tokscroll .tok[data-i]`, (els) => {
    const enc = new TextEncoder();
    return JSON.stringify(els.map((e) => {
      if (!e.classList.contains("tx") || e.classList.contains("unk")) return [Number(e.dataset.i), null];
      const b = [];
      for (const n of e.childNodes) {
        if (n.nodeType === 1 && n.classList.contains("bytes")) b.push(...n.dataset.bytes.split(",").map(Number));
        else b.push(...enc.encode(n.textContent));
      }
      return [Number(e.dataset.i), b];
    }));
  }));
}

/** What the mock decodes `ids` to. */
async function mockDecode(ids) {
  const resp = await fetch(`${MOCK}/detokenize`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ tokens: ids }) });
  check(resp.ok, `the mock's /detokenize: ${resp.status}`);
  return (await resp.json()).prompt;
}

/** The kind the exported row says token i of trace `row` has. */
function expectedKind(row, i) {
  const P = row.prompt_ids.length;
  if (i < P) return "kp";
  return row.loss_mask[i - P] === 1 ? "kt" : "kg";
}

/** Scrolls the grid from top to bottom; checks every token's colour; collects each cell's bytes into `bytes` (if given). */
async function checkMaskEverywhere(page, row, bytes = null) {
  const n = row.prompt_ids.length + row.response_ids.length;
  const seen = new Uint8Array(n);
  await page.$eval("#trajectory .tokscroll", (el) => { el.scrollTop = 0; });
  for (let guard = 0; guard < 10000; guard++) {
    await page.waitForTimeout(30);
    for (const [i, cls] of await renderedCells(page)) {
      check(i < n, `cell ${i} within the trace (${n} tokens)`);
      const want = expectedKind(row, i);
      check(cls.split(" ").includes(want), `token ${i}: class "${cls}" has ${want} (loss mask ${row.loss_mask[i - row.prompt_ids.length]})`);
      check(cls.includes(` ${"h"}`) === false || cls.includes("kt"), `token ${i}: heat on a trained token only`);
      seen[i] = 1;
    }
    if (bytes) for (const [i, b] of await renderedBytes(page)) bytes[i] = b;
    const done = await page.$eval("#trajectory .tokscroll", (el) => {
      if (el.scrollTop + el.clientHeight >= el.scrollHeight - 1) return true;
      el.scrollTop += el.clientHeight - 22;
      return false;
    });
    if (done) break;
  }
  await page.waitForTimeout(30);
  for (const [i] of await renderedCells(page)) seen[i] = 1;
  if (bytes) for (const [i, b] of await renderedBytes(page)) bytes[i] = b;
  const missing = seen.indexOf(0);
  check(missing < 0, `every token was rendered once while scrolling (token ${missing} never was)`);
  return n;
}

/** A node played by this script: takes one assignment, answers 202. */
async function fakeNode() {
  const assignments = [];
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => { body += c; });
    req.on("end", () => {
      if (req.method === "POST" && req.url === "/v1/sessions") {
        assignments.push(JSON.parse(body));
        res.writeHead(202, { "content-type": "application/json" });
        res.end("{}");
      } else {
        res.writeHead(200, { "content-type": "application/json" });
        res.end("{}");
      }
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const address = `http://127.0.0.1:${server.address().port}`;
  // A new instance per browser's run: the server takes it as a restart.
  const instance = `fake-${process.pid}-${Date.now()}`;
  const node = { assignments, address, server };
  await rest("/v1/nodes/register", {
    token: FAKE_TOKEN,
    method: "POST",
    body: { node_id: FAKE, address, instance, capacity: { max_sessions: 1 }, labels: { played_by: "dashboard test" } },
  });
  node.beat = setInterval(() => {
    rest(`/v1/nodes/${FAKE}/heartbeat`, { token: FAKE_TOKEN, method: "POST", body: { instance, active: assignments.length ? 1 : 0 } }).catch(() => {});
  }, 500);
  return node;
}

/** A 200,000-token prefix-merged trace: 100 calls, each 480 tokens of glue then 1,480 generated. */
/** The segment after a compaction that continues the big trace's chain. */
function compactedRow(big) {
  const P = 300;
  const n = 200;
  return {
    ...big,
    trace_id: `${big.session_id}/1`, trace_index: 1, segment: 1, segment_kind: "after_break", break_reason: "compaction",
    prompt_ids: Array.from({ length: P }, (_, i) => (i * 53) % 151000),
    response_ids: Array.from({ length: n }, (_, i) => (i * 89) % 151000),
    loss_mask: Array(n).fill(1), response_logprobs: Array(n).fill(-0.25),
    call_ids: ["big-call-100"],
    trace_metadata: { spans: [{ response_start: 0, response_len: n, join: { kind: "first" } }], previous: { chain: 0, segment: 0, common_prefix_len: 120 } },
  };
}

function bigRow(taskId, session) {
  const P = 2000;
  const calls = 100;
  const glue = 480;
  const gen = (BIG_TOKENS - P) / calls - glue;
  const prompt_ids = Array.from({ length: P }, (_, i) => (i * 7919) % 151000);
  const response_ids = [];
  const loss_mask = [];
  const response_logprobs = [];
  const spans = [];
  for (let k = 0; k < calls; k++) {
    const g = k === 0 ? 0 : glue;
    for (let j = 0; j < g; j++) {
      response_ids.push((k * 31 + j * 13) % 151000);
      loss_mask.push(0);
      response_logprobs.push(0);
    }
    spans.push({ response_start: response_ids.length, response_len: gen + (k === 0 ? glue : 0), join: { kind: k === 0 ? "first" : "extend" } });
    for (let j = 0; j < gen + (k === 0 ? glue : 0); j++) {
      response_ids.push((k * 101 + j * 17) % 151000);
      loss_mask.push(1);
      response_logprobs.push(-(((k + j) % 50) / 10));
    }
  }
  check(P + response_ids.length === BIG_TOKENS, `the big trace has ${BIG_TOKENS} tokens`);
  // Call 5 joined by a template splice: its template re-rendered the
  // previous turn from 3 tokens before that turn's end.
  spans[5].join = { kind: "splice", diverged_at: P + spans[4].response_start + spans[4].response_len - 3, resumed_from: 17 };
  const loss = loss_mask.filter((m) => m === 1).length;
  return {
    schema_version: 1, trace_id: `${session}/0`, session_id: session, task_id: taskId, group_id: taskId, attempt: 1,
    policy_version: "w-1", weight_version: null, status: "completed", error: null, builder: "prefix_merging",
    trace_index: 0, chain: 0, chain_role: "main", segment: 0, segment_kind: "start", break_reason: null, labels: [],
    finish_reason: "stop", reward: 1.0, prompt_ids, response_ids, loss_mask, response_logprobs,
    prompt_messages: [{ role: "user", content: [{ type: "text", text: "A long synthetic session." }] }], response_messages: [], tools: [],
    call_ids: spans.map((_, k) => `big-call-${k}`), trace_metadata: { spans },
    trajectory_metadata: { builder: { kind: "prefix_merging" }, session_id: session },
    stats: { calls, chains: 1, segments: 1, calls_merged: calls, calls_dropped: [], retries_superseded: 0, forks: 0, breaks: 0,
      template_mismatches_detected: 0, template_mismatches_spliced: 0, truncated_calls: 0, prompt_tokens: P,
      response_tokens: response_ids.length, loss_tokens: loss },
  };
}

/** Every check, in the browser `kind`; screenshots only if `shots`. */
async function run({ kind, executable }, shots) {
  const started = Date.now();
  for (const k of Object.keys(measurements)) delete measurements[k];
  const browser = await launch(kind, { executable, modules: MODULES });
  const page = browser.page;
  const shot = (what, name, opts = {}) => (shots ? what.screenshot({ ...opts, path: join(SHOTS, name) }) : null);
  const requests = [];
  let fake = null;
  try {
    page.on("request", (r) => requests.push(r.url()));
    const pageErrors = [];
    page.on("pageerror", (e) => pageErrors.push(e.message));
    page.on("dialog", (d) => d.accept());

    // 1. The token, once; a viewer sees no control.
    await page.goto(`${SERVER}/ui`);
    await page.waitForSelector("form.login #token", { timeout: 15000 });
    await page.fill("#token", VIEWER);
    await page.click("form.login button[type=submit]");
    await page.waitForSelector("#tasks", { timeout: 15000 });
    check((await page.textContent("#role")) === "viewer", "the role badge says viewer");
    check((await page.$("#pause")) === null, "no pause button for a viewer");
    const stored = await page.evaluate(() => sessionStorage.getItem("polar.rollout.token"));
    check(stored === VIEWER, "the token is kept in sessionStorage");
    await page.evaluate(() => { window.__sameDocument = true; });

    // 2. A task followed live on the overview.
    const taskId = `dash-${Date.now()}`;
    await submitMiniAgent(taskId, 6);
    await page.waitForSelector(`tr[data-task="${taskId}"]`, { timeout: 30000 });
    // The overview while it runs, once the node's RUNNING pool is busy
    // (on a fast machine the task may end first: then as it is).
    await page.waitForFunction((node) => {
      const pool = document.querySelector(`tr[data-node="${node}"] td.pool[title^="running: "]`);
      return pool && !pool.title.startsWith("running: 0 ");
    }, NODE, { timeout: 60000 }).catch(() => log("the RUNNING pool was never seen busy"));
    await shot(page, "overview-running.png");
    await page.waitForSelector(`tr[data-task="${taskId}"][data-status="completed"]`, { timeout: TASK_LIMIT_MS });
    check(await page.evaluate(() => window.__sameDocument === true), "the overview updated without a reload");
    check((await page.textContent("#live")) === "live", "the event stream is live");
    const mean = await page.$eval(`tr[data-task="${taskId}"] td.reward`, (td) => td.textContent);
    check(mean === "1.000", `mean reward 1.000 shown (got ${mean})`);
    const grpo = await page.textContent("#grpo");
    check(/without learning signal \(zero reward variance\)/.test(grpo) && grpo.includes("mean reward by policy version: w-1 1.000"), `the GRPO summary (got ${grpo})`);
    check(Number((await page.textContent("#grpo-flat")).split(" ")[0]) >= 1, "the flat group is counted");
    await shot(page, "overview.png");
    log("overview followed", taskId, "to completed");

    // 3. The task page and its filters.
    await page.click(`tr[data-task="${taskId}"] a`);
    await page.waitForSelector("tr[data-sample]", { timeout: 15000 });
    check((await page.$$("tr[data-sample]")).length === 6, "six samples listed");
    check((await page.$("#cancel")) === null, "no cancel button for a viewer");
    await page.selectOption("#filter", "failed");
    await page.waitForFunction(() => document.querySelectorAll("tr[data-sample]").length === 0, null, { timeout: 5000 });
    await page.selectOption("#filter", "all");
    await page.fill("#reward-min", "2");
    await page.waitForFunction(() => document.querySelectorAll("tr[data-sample]").length === 0, null, { timeout: 5000 });
    await page.fill("#reward-min", "1");
    await page.waitForFunction(() => document.querySelectorAll("tr[data-sample]").length === 6, null, { timeout: 5000 });
    await shot(page, "task.png");
    check((await page.textContent("#usable")) === "6/6 usable", "the task page says 6/6 usable");
    check((await page.$("#failures")) === null, "no failure list for a task without failures");
    // Every sample rewarded 1: zero spread, no learning signal.
    check((await page.textContent("#reward-spread")) === " ± 0.000", "the reward spread is shown");
    check((await page.$("#no-signal")) !== null, "a group without reward variance is marked");

    // 3a. A task whose evaluator never scores: failed (not completed), no
    //     mean reward, its failures grouped with their reason.
    const unscored = `dash-unscored-${Date.now()}`;
    await submitMiniAgent(unscored, 2, undefined, { kind: "command", options: { command: "true", reward: "file" } });
    await page.evaluate((t) => { location.hash = `#/task/${t}`; }, unscored);
    await page.waitForSelector("#task-status .badge.s-failed", { timeout: TASK_LIMIT_MS });
    check((await page.textContent("#usable")) === "0/2 usable", "the failed task says 0/2 usable");
    check((await page.textContent("#mean-reward")) === "–", "no mean reward without a usable sample");
    const failures = await page.$$eval("#failures li", (lis) => lis.map((li) => li.textContent));
    check(failures.length === 1 && failures[0] === "error 2 samples: evaluation failed: reward file .polar/reward: not found in the workspace (the command exited with 0) (0, 1)",
      `the failures grouped with their reason (got ${JSON.stringify(failures)})`);

    // 3b. A running session's timeline, live: its calls show as they end,
    //     before the session does (the harness sleeps after its last
    //     call), and the result's list replaces them, without a reload.
    const liveTask = `dash-live-${Date.now()}`;
    await submitMiniAgent(liveTask, 1, `python3 /workspace/mini_agent.py && sleep ${LIVE_SLEEP_SECS}`);
    await page.evaluate((t) => { location.hash = `#/session/${t}/0`; }, liveTask);
    await page.waitForSelector('#timeline[data-live="true"] .tl-row[data-seq]', { timeout: TASK_LIMIT_MS });
    const running = await rest(`/v1/tasks/${liveTask}/samples/0`, { token: VIEWER });
    check(running.state === "running" && !running.result, `the session still runs while its calls show (${running.state})`);
    check(running.live_calls.length >= 1 && running.live_calls_total === running.live_calls.length, "the server lists the calls reported so far");
    const liveIds = await page.$$eval("#timeline .tl-row[data-seq]", (els) => els.map((e) => e.dataset.seq));
    check(liveIds.length <= running.live_calls.length, `no more rows (${liveIds.length}) than calls reported (${running.live_calls.length})`);
    await shot(page, "timeline-live.png");
    await page.waitForSelector('#timeline[data-live="false"] .tl-row[data-seq]', { timeout: TASK_LIMIT_MS });
    const ended = await rest(`/v1/tasks/${liveTask}/samples/0`, { token: VIEWER });
    const endedCalls = ended.result.stats.calls;
    check(running.live_calls.every((c) => endedCalls.some((d) => d.call_id === c.call_id && d.seq === c.seq && d.finished_ms === c.finished_ms)), "each live call is in the result's list, the same");
    await page.waitForFunction((k) => document.querySelectorAll("#timeline .tl-row[data-seq]").length === k, endedCalls.length, { timeout: 15000 });
    check(await page.evaluate(() => window.__sameDocument === true), "the live timeline updated without a reload");
    log(`live timeline: ${liveIds.length} calls shown while ${liveTask} ran, ${endedCalls.length} in its result`);
    await page.evaluate((t) => { location.hash = `#/task/${t}`; }, taskId);
    await page.waitForSelector("tr[data-sample]", { timeout: 15000 });

    // 4. A session: timeline and trajectory, the colouring against the export.
    const session = `${taskId}-s0`;
    const sample = await rest(`/v1/tasks/${taskId}/samples/0`, { token: VIEWER });
    const calls = sample.result.stats.calls;
    check(calls.length >= 1 && calls.length === sample.result.stats.calls_total, `the result lists the session's calls (${calls.length})`);
    await page.click(`tr[data-sample="0"] a`);
    await page.waitForSelector("#timeline .tl-row[data-seq]", { timeout: 15000 });
    check((await page.$$("#timeline .tl-row[data-seq]")).length === calls.length, "one timeline row per call");
    // The wait in the agent before the call left for its replica is its
    // own bar, apart from the time to first token.
    for (const c of calls) {
      check(Number.isInteger(c.sent_ms) && c.received_ms <= c.sent_ms && c.sent_ms <= c.finished_ms && (c.first_token_ms == null || c.sent_ms <= c.first_token_ms), `call ${c.seq}: received ${c.received_ms} <= sent ${c.sent_ms} <= first token ${c.first_token_ms} / finished ${c.finished_ms}`);
    }
    check((await page.$$("#timeline .tl-row[data-seq] .tl-queue")).length === calls.length, "a queue bar per call");
    check((await page.$$("#timeline .tl-row[data-seq] .tl-ttft")).length === calls.filter((c) => c.first_token_ms != null).length, "a time-to-first-token bar per streamed call");
    await page.waitForSelector("#trajectory[data-loaded-ms] .tokscroll .tok", { timeout: 30000 });
    const rows = exportedRows(taskId, session);
    check(rows.length >= 1, "the session exported a trace");
    const cellBytes = [];
    const n = await checkMaskEverywhere(page, rows[0], cellBytes);
    log(`loss mask of ${session} trace 0 matches the export on all ${n} tokens`);
    // Jump to the first trained token: the export's first mask-1 position.
    {
      const r0 = rows[0];
      const first = r0.prompt_ids.length + r0.loss_mask.indexOf(1);
      await page.click("#jump-trained");
      const detail = await page.textContent("#token-detail");
      check(detail.startsWith(`token ${first} · `) && detail.includes("trained (loss 1)"), `the jump shows the first trained token ${first}: ${detail.slice(0, 120)}`);
    }
    // The token text: every cell shows text, and the cells of each call's
    // generated tokens (and of the whole trace) read as the mock decodes
    // their ids.
    {
      const r0 = rows[0];
      const P = r0.prompt_ids.length;
      const all = r0.prompt_ids.concat(r0.response_ids);
      const note = await page.textContent("#token-text-note");
      check(note.includes("tokenizer.json"), `the page names the tokenizer: ${note}`);
      const text = (from, to) => {
        const b = [];
        for (let i = from; i < to; i++) {
          check(Array.isArray(cellBytes[i]), `token ${i} (id ${all[i]}) shows its text`);
          b.push(...cellBytes[i]);
        }
        return new TextDecoder().decode(new Uint8Array(b));
      };
      let checked = 0;
      for (const sp of r0.trace_metadata.spans) {
        const from = P + sp.response_start;
        const want = await mockDecode(r0.response_ids.slice(sp.response_start, sp.response_start + sp.response_len));
        check(text(from, from + sp.response_len) === want, `call ${checked}'s generated tokens read ${JSON.stringify(want)}`);
        checked++;
      }
      check(checked >= 1 && text(0, all.length) === (await mockDecode(all)), "the whole trace reads as the mock decodes it");
      log(`token text of ${session} trace 0: ${checked} calls' generated tokens and all ${all.length} tokens read as the mock decodes them`);
      // Ids on demand, text back.
      await page.$eval("#trajectory .tokscroll", (el) => { el.scrollTop = 0; });
      await page.click("#show-ids");
      await page.waitForFunction((id) => { const t = document.querySelector('#trajectory .tok[data-i="0"]'); return t && !t.classList.contains("tx") && t.textContent === String(id); }, all[0], { timeout: 5000 });
      await page.click("#show-text");
      await page.waitForSelector('#trajectory .tok.tx[data-i="0"]', { timeout: 5000 });
    }
    await page.$eval("#trajectory .tokscroll", (el) => { el.scrollTop = 0; });
    for (let guard = 0; guard < 1000 && !(await page.$("#trajectory .tok.kt")); guard++) {
      await page.$eval("#trajectory .tokscroll", (el) => { el.scrollTop += el.clientHeight / 2; });
      await page.waitForTimeout(30);
    }
    await page.click("#trajectory .tok.kt");
    await page.waitForSelector("#token-detail .msg", { timeout: 5000 });
    check((await page.$$("#token-detail .toktext")).length === 1, "the clicked token's text in its detail");
    await shot(page, "session.png", { fullPage: true });
    const traj = await page.$("#trajectory");
    await shot(traj, "trajectory.png");

    // 4b. The calls, from the export: the node removed its capture.
    {
      check(!existsSync(join(WORK, "state", "sessions", session)), `the node dropped ${session}'s capture directory`);
      const uri = sample.result.stats.calls_uri;
      check(uri === join(EXPORT, `task=${taskId}`, `${session}.calls.jsonl.zst`) && existsSync(uri), `the calls file ${uri} is beside the trajectory`);
      await page.click("#show-calls");
      await page.waitForSelector("#calls-list details.call", { timeout: 15000 });
      const ids = await page.$$eval("#calls-list details.call", (els) => els.map((e) => e.dataset.callId));
      const inRows = new Set(rows.flatMap((r) => r.call_ids));
      check(ids.length === calls.length && ids.every((id, i) => id === calls[i].call_id), `one entry per call, in order (${ids.length} of ${calls.length})`);
      check([...inRows].every((id) => ids.includes(id)), "every call of the exported rows is listed");
      await page.click("#calls-list details.call summary");
      const native = await page.textContent("#calls-list details.call .native-request");
      const reply = await page.textContent("#calls-list details.call .reply");
      check(native.includes("Create the file polar-demo.txt."), "the native request holds the task's instruction as the harness sent it");
      check(reply.includes("\"choices\"") || reply.includes("\"message\""), `the reply is shown (${reply.slice(0, 80)})`);
      await shot(await page.$("#calls"), "calls.png");
      log(`${ids.length} calls of ${session} shown from the exported calls file`);
    }

    // 5. Logprob heat, per_request view, side by side.
    await page.click("#mode-logprob");
    await page.waitForSelector("#trajectory .tok.kt[class*=' h']", { timeout: 5000 });
    // Each trained token's heat step is its exported logprob's probability.
    {
      const r0 = rows[0];
      const P = r0.prompt_ids.length;
      let heated = 0;
      for (const [i, cls] of await renderedCells(page)) {
        if (i < P || r0.loss_mask[i - P] !== 1) continue;
        const want = `h${Math.min(9, Math.floor(Math.exp(Math.fround(r0.response_logprobs[i - P])) * 10))}`;
        check(cls.split(" ").includes(want), `token ${i}: heat ${want} for logprob ${r0.response_logprobs[i - P]} (class "${cls}")`);
        heated++;
      }
      check(heated > 0, "trained tokens in view with their heat");
    }
    await shot(traj, "trajectory-logprob.png");
    await page.click("#mode-mask");
    const spans = rows.reduce((a, r) => a + r.trace_metadata.spans.length, 0);
    await page.click("#view-calls");
    await page.waitForFunction((k) => document.querySelectorAll("#trajectory .traceitem").length === k, spans, { timeout: 5000 });
    // Call 1 alone: its generated tokens trained, all before them prompt.
    if (spans > 1) {
      await page.click('#trajectory .traceitem[data-unit="1"]');
      const sp = rows[0].trace_metadata.spans[1];
      const start = rows[0].prompt_ids.length + sp.response_start;
      await page.waitForFunction(() => document.querySelector("#trajectory .tokscroll .tok") !== null);
      for (const [i, cls] of await renderedCells(page)) {
        check(cls.includes(i < start ? "kp" : "kt"), `per_request call 1, token ${i}: ${cls}`);
      }
    }
    await shot(traj, "trajectory-per-request.png");
    await page.goto(`${SERVER}/ui#/compare/${taskId}/0/1`);
    await page.waitForSelector('.compare-col[data-sample="1"] .tokscroll .tok', { timeout: 30000 });
    await page.waitForSelector('.compare-col[data-sample="0"] .tokscroll .tok', { timeout: 30000 });
    await shot(page, "compare.png");
    check(await page.evaluate(() => sessionStorage.getItem("polar.rollout.token") !== null), "the token survived a navigation in the tab");

    // 6. A trainer token: pause and resume reach the node.
    await page.evaluate(() => { location.hash = "#/"; });
    await page.waitForSelector("#tasks", { timeout: 15000 });
    await page.click("#logout");
    await page.waitForSelector("form.login #token");
    await page.fill("#token", TRAINER);
    await page.click("form.login button[type=submit]");
    await page.waitForSelector("#pause", { timeout: 15000 });
    await page.click("#pause");
    await page.waitForFunction(() => document.querySelector("#gen-state").textContent.startsWith("paused"), null, { timeout: 15000 });
    await shot(page, "overview-paused.png");
    await page.fill("#policy-version", "w-2");
    await page.click("#resume");
    await page.waitForFunction(() => document.querySelector("#gen-state").textContent === "generating" && document.querySelector("#policy").textContent === "w-2", null, { timeout: 15000 });
    log("pause and resume reached the node");

    // 7. The 200,000-token trace.
    fake = await fakeNode();
    await rest(`/v1/nodes/${NODE}/drain`, { method: "POST", body: { draining: true } });
    const bigTask = `dash-big-${Date.now()}`;
    await rest("/v1/tasks", { method: "POST", body: { task_id: bigTask, instruction: "long", num_samples: 1, timeout_secs: 600, agent: { harness: "shell", options: { command: "true" } } } });
    const a = await until("the big task's assignment", 30000, async () => fake.assignments[0]);
    await rest(`/v1/nodes/${NODE}/drain`, { method: "POST", body: { draining: false } });
    const big = bigRow(bigTask, a.session_id);
    mkdirSync(join(EXPORT, `task=${bigTask}`), { recursive: true });
    const bigFile = join(EXPORT, `task=${bigTask}`, `${a.session_id}.jsonl`);
    writeFileSync(bigFile, `${JSON.stringify(big)}\n${JSON.stringify(compactedRow(big))}\n`);
    const t0 = 1790000000000;
    const bigCalls = big.trace_metadata.spans.map((s, k) => ({
      call_id: `big-call-${k}`, seq: k, api: "openai_chat", model: "default", received_ms: t0 + k * 2000,
      sent_ms: t0 + k * 2000 + 40, first_token_ms: t0 + k * 2000 + 150, finished_ms: t0 + k * 2000 + 1500, finish_reason: k === 99 ? "stop" : "tool_calls",
      prompt_tokens: 2000 + s.response_start, response_tokens: s.response_len, status: k === 40 ? "failed" : "completed",
      side: k === 40 ? "backend" : null, error: k === 40 ? "backend answered 503" : null, retry_of: k === 41 ? 40 : null,
    }));
    await rest(`/v1/sessions/${a.session_id}/result`, {
      token: FAKE_TOKEN,
      method: "POST",
      body: { node_id: FAKE, attempt: a.attempt, status: "completed", reward: 1.0, trajectory_uri: bigFile,
        tokens: { prompt: 2000, response: BIG_TOKENS - 2000, calls: 100 }, stats: { calls: bigCalls, calls_total: 100, stage_ms: { init: 10, ready: 1, running: 200000, postrun: 50 } } },
    });
    await page.goto(`${SERVER}/ui#/task/${bigTask}`);
    await page.waitForSelector('tr[data-sample="0"] a', { timeout: 15000 });
    const opened = Date.now();
    await page.click('tr[data-sample="0"] a');
    await page.waitForSelector("#trajectory[data-loaded-ms] .tokscroll .tok", { timeout: BIG_OPEN_LIMIT_MS * 2 });
    const openMs = Date.now() - opened;
    const cells = (await page.$$("#trajectory .tokscroll .tok")).length;
    check(cells < 5000, `only the rows in view are in the DOM (${cells} cells)`);
    check((await page.$$("#timeline .tl-row.failed")).length === 1 && (await page.$$("#timeline .tl-row.retry")).length === 1, "the failed call and its retry are marked");
    const scrolled = Date.now();
    const frames = [];
    const phase = { jump: 0, wait: 0, cells: 0 };
    for (let s = 0; s <= BIG_SCROLL_STEPS; s++) {
      let p0 = Date.now();
      // The jump and the two frames after it, timed in the page: the scroll
      // event's redraw runs in the first.
      const [want, frameMs] = await page.$eval("#trajectory .tokscroll", async (el, f) => {
        const t = performance.now();
        el.scrollTop = Math.round((el.scrollHeight - el.clientHeight) * f);
        await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
        return [el.scrollTop, performance.now() - t];
      }, s / BIG_SCROLL_STEPS);
      frames.push(frameMs);
      phase.jump += Date.now() - p0;
      p0 = Date.now();
      await page.waitForFunction((top) => {
        const el = document.querySelector("#trajectory .tokscroll");
        const win = el.querySelector(".tokwin");
        const t = parseFloat(win.style.top);
        return t <= top && t + win.offsetHeight >= top + el.clientHeight - 22;
      }, want, { timeout: 10000 });
      phase.wait += Date.now() - p0;
      p0 = Date.now();
      const seen = await renderedCells(page);
      phase.cells += Date.now() - p0;
      check(seen.length > 0, `cells rendered at step ${s}`);
      for (const [i, cls] of seen) check(cls.includes(expectedKind(big, i)), `200k trace token ${i}: ${cls}`);
    }
    const scrollMs = Date.now() - scrolled;
    log(`${kind}: the jumps' time in the driver: jump ${phase.jump} ms, wait for the rows ${phase.wait} ms, read the cells ${phase.cells} ms`);
    frames.sort((x, y) => x - y);
    await page.$eval("#trajectory .tokscroll", (el) => { el.scrollTop = el.scrollHeight / 2; });
    await page.waitForTimeout(100);
    await shot(await page.$("#trajectory"), "trajectory-200k.png");
    // The splice is marked where the template re-rendered the turn.
    const spliceAt = big.trace_metadata.spans[5].join.diverged_at;
    await page.$eval("#trajectory", (el, i) => { el.dispatchEvent(new CustomEvent("reveal", { detail: i })); }, spliceAt);
    await page.waitForSelector(`#trajectory .tok[data-i="${spliceAt}"].b-splice`, { timeout: 5000 });
    // The segment after the compaction says so.
    await page.click('#trajectory .traceitem[data-unit="1"]');
    await page.waitForSelector("#break-banner", { timeout: 5000 });
    const banner = await page.textContent("#break-banner");
    check(banner.startsWith("Compaction starts here") && banner.includes("shares 120 tokens with segment 0"), `the compaction banner: ${banner}`);
    await shot(await page.$("#trajectory"), "trajectory-compaction.png");
    // The first calls of the 100-call timeline (the rest is the same).
    await page.$eval("#timeline", (el) => { el.style.maxHeight = "860px"; el.style.overflow = "hidden"; el.scrollIntoView(); });
    await shot(await page.$("#timeline"), "timeline-200k.png");
    measurements.big_trace_tokens = BIG_TOKENS;
    measurements.big_trace_file_bytes = readFileSync(bigFile).length;
    measurements.big_trace_open_ms = openMs;
    measurements.big_trace_server_read_ms = Number(await page.$eval("#trajectory", (el) => el.dataset.loadedMs));
    measurements.big_trace_scroll_steps = BIG_SCROLL_STEPS + 1;
    measurements.big_trace_scroll_total_ms = scrollMs;
    measurements.big_trace_jump_to_painted_ms_median = Math.round(frames[Math.floor(frames.length / 2)]);
    measurements.big_trace_jump_to_painted_ms_max = Math.round(frames[frames.length - 1]);
    measurements.big_trace_dom_cells = cells;
    log("200k-token trace:", JSON.stringify(measurements));
    check(openMs < BIG_OPEN_LIMIT_MS, `the 200,000-token trace opened in ${openMs} ms (limit ${BIG_OPEN_LIMIT_MS})`);
    check(scrollMs < BIG_SCROLL_LIMIT_MS, `${BIG_SCROLL_STEPS + 1} jumps through it took ${scrollMs} ms (limit ${BIG_SCROLL_LIMIT_MS})`);

    check(pageErrors.length === 0, `no error in the page: ${pageErrors.join("; ")}`);
    // Nothing was fetched from elsewhere; no token in any URL.
    for (const u of requests) {
      check(u.startsWith(SERVER) || u.startsWith("data:"), `request to this server only: ${u}`);
      check(!u.includes(VIEWER) && !u.includes(TRAINER), `no token in a URL: ${u}`);
    }
    log(`${kind}: all checks passed in ${Date.now() - started} ms (${requests.length} requests, all to ${SERVER})`);
  } finally {
    if (fake) {
      clearInterval(fake.beat);
      await new Promise((r) => fake.server.close(r));
    }
    await browser.close();
  }
}

async function main() {
  const all = {};
  for (const [k, b] of BROWSERS.entries()) {
    await run(b, k === 0);
    all[b.kind] = { ...measurements };
  }
  if (process.env.POLAR_MEASUREMENTS) writeFileSync(process.env.POLAR_MEASUREMENTS, JSON.stringify(all, null, 2));
}

main().catch((e) => {
  console.error("[dashboard] FAILED:", e && e.stack ? e.stack : e);
  process.exit(1);
});
