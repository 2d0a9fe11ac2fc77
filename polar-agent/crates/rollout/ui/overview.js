// The overview: generation state and policy versions, tasks (progress,
// mean reward, status counts), nodes (stage pools, heartbeats, drain).
// Live: every event of the server's stream schedules a refresh (batched);
// nodes are read again every 2 s for their heartbeat ages.

import { api, followEvents } from "./api.js";
import { h, mount, badge, fmtMs, fmtReward, fmtTime, seg, noSignal } from "./dom.js";

const STAGES = ["init", "ready", "running", "postrun"];

export function overview(root, ctx) {
  ctx.crumbs(h("span", "Overview"));
  const gen = h("section.card#generation");
  const tasks = h("section.card#tasks");
  const nodes = h("section.card#nodes");
  mount(root, h("div.grid2", gen, nodes), tasks);
  let timer = null;
  let stopped = false;
  const refresh = async () => {
    timer = null;
    try {
      const [status, list] = await Promise.all([api("/v1/status"), api("/v1/tasks?limit=200")]);
      if (stopped) return;
      renderGeneration(gen, status.nodes, ctx, refreshSoon);
      renderNodes(nodes, status.nodes);
      renderTasks(tasks, list.tasks, status);
    } catch (e) {
      if (!stopped) mount(tasks, h("p.error", `Could not read the server: ${e.message}`));
    }
  };
  const refreshSoon = () => {
    if (!timer) timer = setTimeout(refresh, 250);
  };
  refresh();
  // A running session's calls change nothing shown here.
  const stop = followEvents({ onEvent: (e) => e.type !== "calls" && refreshSoon(), onState: ctx.setLive });
  const tick = setInterval(refreshSoon, 2000);
  return () => {
    stopped = true;
    stop();
    clearInterval(tick);
    if (timer) clearTimeout(timer);
  };
}

function renderGeneration(el, nodes, ctx, refresh) {
  const paused = nodes.filter((n) => n.last_heartbeat && n.last_heartbeat.paused);
  const versions = [...new Set(nodes.map((n) => n.last_heartbeat && n.last_heartbeat.policy_version).filter(Boolean))];
  const state = nodes.length === 0 ? "no node" : paused.length === 0 ? "generating" : paused.length === nodes.length ? "paused" : `paused on ${paused.length} of ${nodes.length} nodes`;
  if (!el.firstChild) {
    // Built once: the controls keep what is typed across refreshes.
    const controls = [];
    if (ctx.mayControl) {
      const version = h("input#policy-version", { placeholder: "new policy version (optional)", size: 24 });
      const act = async (what) => {
        const body = what === "resume" && version.value.trim() ? { policy_version: version.value.trim() } : {};
        const errs = [];
        for (const n of el._nodes || []) {
          try {
            await api(`/v1/nodes/${seg(n.node_id)}/${what}`, { method: "POST", body });
          } catch (e) {
            errs.push(`${n.node_id}: ${e.message}`);
          }
        }
        if (errs.length) alert(errs.join("\n"));
        refresh();
      };
      controls.push(
        h("div.controls",
          h("button#pause", { onclick: () => confirm("Pause new generations on every node?") && act("pause") }, "Pause generation"),
          version,
          h("button#resume", { onclick: () => act("resume") }, "Resume"),
        ),
      );
    }
    mount(
      el,
      h("h2", "Generation"),
      h("p", h("span.big#gen-state")),
      h("p", "Policy version: ", h("b#policy")),
      controls,
    );
  }
  el._nodes = nodes;
  const st = el.querySelector("#gen-state");
  st.textContent = state;
  st.className = `big ${paused.length ? "warn" : "ok"}`;
  el.querySelector("#policy").textContent = versions.length ? versions.join(", ") : "none named by a resume (each task may name its own)";
}

function renderNodes(el, nodes) {
  const rows = nodes.map((n) => {
    const hb = n.last_heartbeat || {};
    const pools = STAGES.map((s) => {
      const load = (hb.stages || {})[s] || { queued: 0, active: 0 };
      const size = (n.capacity.stages || {})[s] || 0;
      return h("td.pool", { title: `${s}: ${load.active} active of ${size} workers, ${load.queued} queued` },
        meter(load.active, size), h("span.small", `${load.active}/${size}`, load.queued ? ` +${load.queued}q` : ""));
    });
    return h("tr", { dataset: { node: n.node_id } },
      h("td", h("b", n.node_id), h("div.small.muted", n.address)),
      h("td", badge(n.health), hb.draining ? badge("draining") : null, hb.paused ? badge("paused") : null,
        Object.entries(n.backends || {}).map(([name, b]) => h("div", { class: `small backend${b.healthy > 0 || b.replicas === 0 ? "" : " down"}`, dataset: { backend: name } },
          `${name}: ${b.healthy}/${b.replicas} replicas healthy`))),
      h("td", `${n.assigned}/${n.capacity.max_sessions}`),
      pools,
      h("td", { class: n.last_heartbeat_ms_ago > 5000 ? "warn" : "" }, `${fmtMs(n.last_heartbeat_ms_ago)} ago`),
    );
  });
  mount(
    el,
    h("h2", `Nodes (${nodes.length})`),
    nodes.length
      ? h("table.nodes", h("thead", h("tr", h("th", "node"), h("th", "health"), h("th", "sessions"), STAGES.map((s) => h("th", s.toUpperCase())), h("th", "heartbeat"))), h("tbody", rows))
      : h("p.muted", "No gateway node has registered."),
  );
}

function meter(value, max) {
  const m = h("meter", { min: 0, max: Math.max(max, 1), value });
  return m;
}

/** GRPO at a glance over the listed tasks (each task one group). */
function grpoSummary(tasks) {
  const ended = tasks.filter((t) => ["completed", "partial", "failed"].includes(t.status));
  if (!ended.length) return null;
  const usable = ended.reduce((a, t) => a + t.counts.usable, 0);
  const requested = ended.reduce((a, t) => a + (t.requested ?? t.num_samples), 0);
  const flat = ended.filter(noSignal).length;
  const byVersion = new Map();
  for (const t of ended) {
    if (t.mean_reward === undefined || t.mean_reward === null) continue;
    const k = t.policy_version || "–";
    const e = byVersion.get(k) || { sum: 0, n: 0, groups: 0 };
    e.sum += t.mean_reward * t.counts.usable;
    e.n += t.counts.usable;
    e.groups += 1;
    byVersion.set(k, e);
  }
  const versions = [...byVersion.entries()].map(([k, e]) => `${k} ${fmtReward(e.sum / e.n)} (${e.groups} ${e.groups === 1 ? "group" : "groups"})`);
  return h("p#grpo.small",
    h("b", "GRPO: "), `${ended.length} finished groups · ${usable}/${requested} samples usable · `,
    h("span#grpo-flat", { class: flat ? "warn" : "" }, `${flat} without learning signal (zero reward variance)`),
    versions.length ? ` · mean reward by policy version: ${versions.join(", ")}` : "");
}

function renderTasks(el, tasks, status) {
  const totals = Object.entries(status.tasks || {}).map(([k, v]) => h("span.total", badge(k), ` ${v}`));
  const rows = tasks.slice().reverse().map((t) => {
    const c = t.counts;
    const ended = c.done + c.failed + c.cancelled;
    return h("tr", { dataset: { task: t.task_id, status: t.status } },
      h("td", h("a", { href: `#/task/${seg(t.task_id)}` }, t.task_id), h("div.small.muted", t.group_id !== t.task_id ? `group ${t.group_id}` : "")),
      h("td", badge(t.status)),
      h("td", h("progress", { max: t.num_samples, value: ended }), h("span.small", ` ${ended}/${t.num_samples}`)),
      h("td.reward", fmtReward(t.mean_reward)),
      h("td.small", h("b", `${c.usable}/${t.requested} usable`), ` · ${c.pending} pending · ${c.dispatched + c.running} running · ${c.done} done · ${c.failed} failed · ${c.cancelled} cancelled`),
      h("td.small", t.policy_version || "–"),
      h("td.small", fmtTime(t.submitted_unix_ms)),
    );
  });
  mount(
    el,
    h("h2", "Tasks ", totals),
    grpoSummary(tasks),
    tasks.length
      ? h("table.tasks", h("thead", h("tr", ["task", "status", "progress", "mean reward", "samples", "policy", "submitted"].map((x) => h("th", x)))), h("tbody", rows))
      : h("p.muted", "No task yet."),
  );
}
