// A sample's page: its outcome (status, reward, attempts, node, timings per
// stage, tokens, the evaluator's output, the exported file), the timeline
// of its model calls (while it runs, live: the calls its node reported so
// far, then each `calls` event's; once done, the result's list), its
// exported trajectory, and its calls from the exported calls file.

import { api, followEvents } from "./api.js";
import { h, mount, badge, fmtReward, fmtInt, pre, seg, stagesText } from "./dom.js";
import { timeline } from "./timeline.js";
import { trajectoryViewer } from "./trajectory.js";
import { callsSection } from "./calls.js";

/** The most calls the server keeps per running session (MAX_LIVE_CALLS). */
const MAX_LIVE_CALLS = 512;

export function sessionPage(root, ctx, taskId, index) {
  ctx.crumbs(h("a", { href: "#/" }, "Overview"), h("a", { href: `#/task/${seg(taskId)}` }, taskId), h("span", `sample ${index}`));
  const head = h("section.card#session-head");
  const tl = h("section.card#timeline");
  const traj = h("section.card#trajectory");
  const callsEl = h("section.card#calls");
  mount(root, head, tl, traj, callsEl);
  let stopped = false;
  let shownDone = false;
  let viewer = null;
  let timer = null;
  // While it runs: its dispatch, the calls reported so far, how many.
  let live = null;
  const drawLive = () => timeline(tl, live.calls, live.total, false, true);
  const load = async () => {
    timer = null;
    let s;
    try {
      s = await api(`/v1/tasks/${seg(taskId)}/samples/${index}`);
    } catch (e) {
      if (!stopped) mount(head, h("p.error", e.message));
      return;
    }
    if (stopped) return;
    renderHead(head, s);
    const stats = (s.result && s.result.stats) || {};
    if (s.result || s.state === "done") {
      live = null;
      timeline(tl, stats.calls || [], stats.calls_total, true);
    } else {
      const calls = s.live_calls || [];
      live = { attempt: s.attempt, calls, total: s.live_calls_total || calls.length, seen: new Set(calls.map((c) => c.call_id)) };
      drawLive();
    }
    if (s.state === "done" && !shownDone) {
      shownDone = true;
      viewer = trajectoryViewer(traj, taskId, index);
      callsSection(callsEl, taskId, index, s);
    } else if (s.state !== "done") {
      mount(traj, h("h2", "Trajectory"), h("p.muted", "Exported when the session ends."));
      callsSection(callsEl, taskId, index, s);
    }
  };
  load();
  const stop = followEvents({ taskId, onEvent: (e) => {
    if (e.sample_index !== index) return;
    if (e.type === "calls") {
      if (!live || e.attempt !== live.attempt) {
        if (!timer) timer = setTimeout(load, 200);
        return;
      }
      for (const c of e.calls) {
        if (live.seen.has(c.call_id)) continue;
        live.seen.add(c.call_id);
        live.total++;
        if (live.calls.length < MAX_LIVE_CALLS) live.calls.push(c);
      }
      drawLive();
    } else if (e.type === "session" && !timer) timer = setTimeout(load, 200);
  }, onState: ctx.setLive });
  return () => {
    stopped = true;
    stop();
    if (timer) clearTimeout(timer);
    if (viewer) viewer();
  };
}

function renderHead(el, s) {
  const r = s.result || {};
  const stats = r.stats || {};
  const stageMs = stats.stage_ms || {};
  mount(el,
    h("h1", s.session_id, " ", badge(s.state), r.status ? badge(r.status) : null),
    h("table.kv",
      row("reward", h("b#reward", fmtReward(r.reward))),
      row("node", s.node || "–"),
      row("attempt", `${s.attempt || "–"} of ${s.attempts} dispatches${s.retries ? `, ${s.retries} infrastructure reruns` : ""}`),
      row("stages", Object.keys(stageMs).length ? stagesText(stageMs, true) : s.stage ? `now ${s.stage.toUpperCase()}` : "–"),
      row("tokens", r.tokens ? `${fmtInt(r.tokens.prompt)} prompt + ${fmtInt(r.tokens.response)} response in ${fmtInt(r.tokens.calls)} calls` : "–"),
      row("ended by", stats.ended_by || "–"),
      row("error", r.error || s.error || s.reason || "–"),
      row("exported file", r.trajectory_uri ? [h("code#export-uri", r.trajectory_uri), " ", download(s)] : "–"),
      s.ended_attempts ? row("ended attempts", s.ended_attempts.map((a) => `#${a.attempt} on ${a.node}: ${a.reason}`).join("; ")) : null,
    ),
    stats.evaluation !== undefined ? h("details#evaluation", h("summary", "Evaluator output"), pre(stats.evaluation)) : null,
    stats.steps && stats.steps.length ? h("details", h("summary", "Prepare and post-run steps"), pre(stats.steps)) : null,
  );
}

/** A button saving the sample's exported rows (as the server read them) as JSON. */
function download(s) {
  const b = h("button#download.small", { onclick: async () => {
    b.disabled = true;
    try {
      const t = await api(`/v1/tasks/${seg(s.task_id)}/samples/${s.sample_index}/trajectory`);
      const url = URL.createObjectURL(new Blob([JSON.stringify(t.rows)], { type: "application/json" }));
      const a = h("a", { href: url, download: `${s.session_id}.rows.json` });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (e) {
      alert(e.message);
    } finally {
      b.disabled = false;
    }
  } }, "Download rows (JSON)");
  return b;
}

function row(k, v) {
  return h("tr", h("th", k), h("td", v));
}
