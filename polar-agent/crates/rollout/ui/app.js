// The dashboard's shell: the token (asked once per tab), who it is
// (GET /v1/whoami: controls only for tokens that may use them), and the
// hash routes:
//   #/                          overview
//   #/task/{task}               a task's samples
//   #/session/{task}/{index}    a sample: timeline and trajectory
//   #/compare/{task}/{a}/{b}    two samples of one group side by side

import { api, forgetToken, setToken, token, ApiError } from "./api.js";
import { h, mount } from "./dom.js";
import { overview } from "./overview.js";
import { taskPage } from "./task.js";
import { sessionPage } from "./session.js";
import { comparePage } from "./compare.js";

const app = document.getElementById("app");
const crumbs = document.getElementById("crumbs");
const live = document.getElementById("live");
const roleEl = document.getElementById("role");
const logout = document.getElementById("logout");

/** What every page gets. */
const ctx = {
  role: null,
  mayControl: false,
  setLive(state) {
    live.textContent = state;
    live.className = `live ${state === "live" ? "on" : "off"}`;
  },
  crumbs(...parts) {
    mount(crumbs, parts.map((p, i) => [i ? h("span.sep", "/") : null, p]));
  },
};

let unmount = null;

function login(message) {
  logout.hidden = true;
  roleEl.textContent = "";
  ctx.crumbs();
  const input = h("input#token", { type: "password", autocomplete: "off", placeholder: "bearer token", required: true });
  const form = h(
    "form.login",
    {
      onsubmit: (e) => {
        e.preventDefault();
        setToken(input.value.trim());
        start();
      },
    },
    h("h1", "Polar rollouts"),
    h("p", "The dashboard reads the rollout API with a token of this server: a viewer token (rollout.viewer_tokens) reads, a trainer token may also cancel tasks and pause generation. It is kept in this tab only (sessionStorage) and sent in the Authorization header."),
    message ? h("p.error", message) : null,
    h("label", "Token ", input),
    h("button", { type: "submit" }, "Open"),
  );
  mount(app, form);
  input.focus();
}

async function start() {
  if (!token()) return login();
  try {
    const who = await api("/v1/whoami");
    ctx.role = who.role;
    ctx.mayControl = who.may_control;
  } catch (e) {
    forgetToken();
    return login(e instanceof ApiError && e.status === 401 ? "That token was refused." : `The server could not be reached: ${e.message}`);
  }
  roleEl.textContent = ctx.role;
  roleEl.className = `role ${ctx.role}`;
  logout.hidden = false;
  route();
}

function route() {
  if (!token()) return login();
  if (unmount) unmount();
  unmount = null;
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  let page;
  if (parts[0] === "task" && parts[1]) page = taskPage(app, ctx, parts[1]);
  else if (parts[0] === "session" && parts[1] && parts[2] !== undefined) page = sessionPage(app, ctx, parts[1], Number(parts[2]));
  else if (parts[0] === "compare" && parts[1]) page = comparePage(app, ctx, parts[1], Number(parts[2]), Number(parts[3]));
  else page = overview(app, ctx);
  unmount = page;
  window.scrollTo(0, 0);
}

logout.addEventListener("click", () => {
  forgetToken();
  if (unmount) unmount();
  unmount = null;
  login();
});
window.addEventListener("hashchange", () => token() && ctx.role && route());
start();
