// Two samples of one task (one GRPO group) side by side: outcome, reward
// and each one's trajectory viewer.

import { api } from "./api.js";
import { h, mount, badge, fmtReward, seg } from "./dom.js";
import { trajectoryViewer } from "./trajectory.js";

export function comparePage(root, ctx, taskId, a, b) {
  ctx.crumbs(h("a", { href: "#/" }, "Overview"), h("a", { href: `#/task/${seg(taskId)}` }, taskId), h("span", `compare ${a} and ${b}`));
  const cols = [a, b].map((i) => h("section.card.compare-col", { dataset: { sample: i } }));
  mount(root, h("div.compare", cols));
  const cleanups = [];
  [a, b].forEach((i, n) => {
    const col = cols[n];
    const head = h("div");
    const traj = h("div");
    mount(col, head, traj);
    api(`/v1/tasks/${seg(taskId)}/samples/${i}`).then((s) => {
      const r = s.result || {};
      mount(head, h("h2", h("a", { href: `#/session/${seg(taskId)}/${i}` }, s.session_id), " ", badge(s.state), r.status ? badge(r.status) : null),
        h("p", `reward ${fmtReward(r.reward)} · group ${s.group_id}`));
      if (s.state === "done") cleanups.push(trajectoryViewer(traj, taskId, i, { ids: false }));
    }, (e) => mount(head, h("p.error", e.message)));
  });
  return () => cleanups.forEach((c) => c());
}
