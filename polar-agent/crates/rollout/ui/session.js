// A sample's page: its outcome (status, reward, attempts, node, timings per
// stage, tokens, the evaluator's output, the exported file), the timeline
// of its model calls, and its exported trajectory.

import { api, followEvents } from "./api.js";
import { h, mount, badge, fmtReward, fmtInt, pre, seg, stagesText } from "./dom.js";
import { timeline } from "./timeline.js";
import { trajectoryViewer } from "./trajectory.js";

export function sessionPage(root, ctx, taskId, index) {
  ctx.crumbs(h("a", { href: "#/" }, "Overview"), h("a", { href: `#/task/${seg(taskId)}` }, taskId), h("span", `sample ${index}`));
  const head = h("section.card#session-head");
  const tl = h("section.card#timeline");
  const traj = h("section.card#trajectory");
  mount(root, head, tl, traj);
  let stopped = false;
  let shownDone = false;
  let viewer = null;
  let timer = null;
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
    timeline(tl, stats.calls || [], stats.calls_total, s.state === "done");
    if (s.state === "done" && !shownDone) {
      shownDone = true;
      viewer = trajectoryViewer(traj, taskId, index);
    } else if (s.state !== "done") {
      mount(traj, h("h2", "Trajectory"), h("p.muted", "Exported when the session ends."));
    }
  };
  load();
  const stop = followEvents({ taskId, onEvent: (e) => {
    if (e.type === "session" && e.sample_index === index && !timer) timer = setTimeout(load, 200);
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
