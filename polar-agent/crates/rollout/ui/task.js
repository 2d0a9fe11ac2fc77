// A task's page: its counts and every sample (status, reward, attempts,
// node, stage timings, tokens, error), filters (failed, timeout, reward
// range), live through the task's own event stream; cancel for tokens that
// may control; two samples picked to compare side by side.

import { api, followEvents } from "./api.js";
import { h, mount, badge, fmtReward, fmtInt, fmtTime, seg, stagesText, evalSummary, noSignal } from "./dom.js";

export function taskPage(root, ctx, taskId) {
  ctx.crumbs(h("a", { href: "#/" }, "Overview"), h("span", taskId));
  const head = h("section.card#task-head");
  const filters = h("section.card.filters");
  const table = h("section.card#samples");
  mount(root, head, filters, table);
  const f = { show: "all", min: "", max: "" };
  const picked = new Set();
  let view = null;
  const select = h("select#filter", { onchange: () => { f.show = select.value; render(); } },
    ["all", "failed", "timeout", "completed", "error", "running", "cancelled"].map((x) => h("option", { value: x }, x)));
  const min = h("input#reward-min", { type: "number", step: "any", placeholder: "min", oninput: () => { f.min = min.value; render(); } });
  const max = h("input#reward-max", { type: "number", step: "any", placeholder: "max", oninput: () => { f.max = max.value; render(); } });
  const compare = h("button#compare", { disabled: true, onclick: () => {
    const [a, b] = [...picked];
    location.hash = `#/compare/${seg(taskId)}/${a}/${b}`;
  } }, "Compare the two picked");
  mount(filters, h("label", "Show ", select), h("label", "Reward from ", min), h("label", " to ", max), compare);

  const render = () => {
    if (!view) return;
    renderHead(head, view, ctx, load);
    const rows = view.samples.filter((s) => keep(s, f)).map((s) => sampleRow(taskId, s, picked, () => {
      compare.disabled = picked.size !== 2;
    }));
    mount(table,
      h("h2", `Samples (${rows.length} of ${view.samples.length})`),
      h("table.samples", h("thead", h("tr", ["", "sample", "state", "status", "reward", "attempt", "node", "stages", "tokens", "calls", "error / evaluator"].map((x) => h("th", x)))), h("tbody", rows)));
  };
  let timer = null;
  let stopped = false;
  async function load() {
    timer = null;
    try {
      const v = await api(`/v1/tasks/${seg(taskId)}`);
      if (stopped) return;
      view = v;
      render();
    } catch (e) {
      if (!stopped) mount(head, h("p.error", e.message));
    }
  }
  load();
  const stop = followEvents({ taskId, onEvent: (e) => { if (e.type !== "calls" && !timer) timer = setTimeout(load, 200); }, onState: ctx.setLive });
  return () => {
    stopped = true;
    stop();
    if (timer) clearTimeout(timer);
  };
}

/** What a sample is, for filters: its result's status, else its state. */
export function outcome(s) {
  if (s.state === "done") return s.result.status;
  if (s.state === "dispatched") return "running";
  return s.state;
}

function keep(s, f) {
  const o = outcome(s);
  if (f.show === "failed" && !(o === "failed" || o === "error")) return false;
  if (f.show !== "all" && f.show !== "failed" && o !== f.show) return false;
  const r = s.result && s.result.reward;
  if (f.min !== "" && !(r !== null && r !== undefined && r >= Number(f.min))) return false;
  if (f.max !== "" && !(r !== null && r !== undefined && r <= Number(f.max))) return false;
  return true;
}

function renderHead(el, v, ctx, reload) {
  const c = v.counts;
  const cancel = ctx.mayControl && (v.status === "queued" || v.status === "running")
    ? h("button#cancel.danger", { onclick: async () => {
      if (!confirm(`Cancel task ${v.task_id}? Its open samples stop.`)) return;
      try {
        await api(`/v1/tasks/${seg(v.task_id)}/cancel`, { method: "POST", body: {} });
      } catch (e) {
        alert(e.message);
      }
      reload();
    } }, "Cancel task")
    : null;
  mount(el,
    h("h1", v.task_id, " ", h("span#task-status", badge(v.status))),
    h("p.small", `group ${v.group_id} · policy ${v.policy_version || "–"} · priority ${v.priority} · submitted ${fmtTime(v.submitted_unix_ms)}`,
      v.finished_unix_ms ? ` · finished ${fmtTime(v.finished_unix_ms)}` : "", v.reason ? ` · ${v.reason}` : ""),
    h("p", h("b#usable", `${c.usable}/${v.requested} usable`), ` · ${c.pending} pending · ${c.dispatched} dispatched · ${c.running} running · ${c.done} done · ${c.failed} failed · ${c.cancelled} cancelled · mean reward of the usable `, h("b#mean-reward", fmtReward(v.mean_reward)),
      v.reward_std !== undefined && v.reward_std !== null ? h("span#reward-spread", ` ± ${fmtReward(v.reward_std)}`) : null,
      noSignal(v) ? [" ", h("span#no-signal.badge.s-partial", { title: "every usable sample has the same reward: GRPO's advantages are all 0" }, "no learning signal")] : null),
    failuresList(v.failures),
    h("p.small", `callback: ${v.callback.state} (${v.callback.attempts} attempts)${v.callback.last_error ? `: ${v.callback.last_error}` : ""}`),
    cancel);
}

/** Why the samples that are not usable ended, grouped (none: nothing). */
function failuresList(groups) {
  if (!groups || !groups.length) return null;
  return h("ul#failures.failures", groups.map((g) => h("li",
    badge(g.status), ` ${g.count} ${g.count === 1 ? "sample" : "samples"}: ${g.error} `,
    h("span.small.muted", `(${g.samples.slice(0, 10).join(", ")}${g.samples.length > 10 ? `, … ${g.samples.length - 10} more` : ""})`))));
}

function sampleRow(taskId, s, picked, changed) {
  const r = s.result || {};
  const stats = r.stats || {};
  const stages = stats.stage_ms ? stagesText(stats.stage_ms) : s.stage ? `now ${s.stage}` : "–";
  const tokens = r.tokens ? `${fmtInt(r.tokens.prompt)} + ${fmtInt(r.tokens.response)}` : "–";
  const ev = stats.evaluation;
  const detail = r.error || s.error || s.reason || (ev ? evalSummary(ev) : "");
  const box = h("input", { type: "checkbox", onchange: () => {
    if (box.checked) picked.add(s.sample_index); else picked.delete(s.sample_index);
    changed();
  } });
  box.checked = picked.has(s.sample_index);
  return h("tr", { dataset: { sample: s.sample_index, outcome: outcome(s) } },
    h("td", box),
    h("td", h("a", { href: `#/session/${seg(taskId)}/${s.sample_index}` }, s.session_id)),
    h("td", badge(s.state)),
    h("td", r.status ? badge(r.status) : "–"),
    h("td.reward", fmtReward(r.reward)),
    h("td", `${s.attempt || s.attempts}${s.retries ? ` (${s.retries} reruns)` : ""}`),
    h("td", s.node || "–"),
    h("td.small", stages),
    h("td.small", tokens),
    h("td", r.tokens ? fmtInt(r.tokens.calls) : "–"),
    h("td.small.clip", { title: detail }, detail),
  );
}
