// The browsers the dashboard's test drives, behind one page interface
// (playwright's, the subset dashboard.test.mjs uses), so its checks are
// written once and run in each:
//   - "chromium": Debian's chromium, driven by playwright-core over CDP;
//   - "firefox": Debian's firefox-esr, driven by puppeteer-core over
//     WebDriver BiDi, which stock Firefox speaks (playwright needs its own
//     patched Firefox, fetched from a CDN; puppeteer drives the system's).
// `launch(kind, { executable, modules })` opens a headless browser with a
// fresh profile and a 1440x900 viewport; it returns { page, close }.

import { createRequire } from "node:module";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const VIEWPORT = { width: 1440, height: 900 };

export async function launch(kind, { executable, modules }) {
  const require = createRequire(join(modules, "x.js"));
  if (kind === "chromium") return launchChromium(require("playwright-core"), executable);
  if (kind === "firefox") return launchFirefox(require("puppeteer-core"), executable);
  throw new Error(`unknown browser ${kind} (chromium or firefox)`);
}

async function launchChromium({ chromium }, executable) {
  const profile = mkdtempSync(join(tmpdir(), "polar-dashboard-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: executable,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    viewport: VIEWPORT,
  });
  const page = context.pages()[0] || (await context.newPage());
  return {
    page,
    close: async () => {
      await context.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}

async function launchFirefox(puppeteer, executable) {
  const profile = mkdtempSync(join(tmpdir(), "polar-dashboard-firefox-"));
  const browser = await puppeteer.launch({
    browser: "firefox",
    executablePath: executable,
    headless: true,
    userDataDir: profile,
    defaultViewport: VIEWPORT,
    // No update checks, telemetry or remote settings: nothing but the
    // server under test is fetched (the test checks every request).
    extraPrefsFirefox: {
      "app.update.enabled": false,
      "browser.safebrowsing.malware.enabled": false,
      "browser.safebrowsing.phishing.enabled": false,
      "datareporting.policy.dataSubmissionEnabled": false,
      "network.captive-portal-service.enabled": false,
      "network.connectivity-service.enabled": false,
      "toolkit.telemetry.enabled": false,
    },
  });
  const page = (await browser.pages())[0] || (await browser.newPage());
  return {
    page: playwrightLike(page),
    close: async () => {
      await browser.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}

/** The page-side expression calling `f` on `target` (an expression) and `arg` (JSON). */
function inPage(f, target, arg) {
  return `(${f.toString()})(${target}, ${arg === undefined ? "undefined" : JSON.stringify(arg)})`;
}

/** A puppeteer page with the playwright methods the test calls. */
function playwrightLike(p) {
  // playwright waits for a visible element by default; so do these.
  const visible = (sel, timeout = 30000) => p.waitForSelector(sel, { visible: true, timeout });
  return {
    on: (event, f) => p.on(event, f),
    goto: (url) => p.goto(url),
    evaluate: (f, arg) => p.evaluate(f, arg),
    $: (sel) => p.$(sel),
    $$: (sel) => p.$$(sel),
    // Evaluated in the page on what it selects there: puppeteer's own
    // $eval/$$eval pass each element as a handle over the protocol, which
    // costs Firefox seconds for a few hundred cells.
    $eval: (sel, f, arg) => p.evaluate(inPage(f, `document.querySelector(${JSON.stringify(sel)}) ?? (() => { throw new Error("no element matches " + ${JSON.stringify(JSON.stringify(sel))}); })()`, arg)),
    $$eval: (sel, f, arg) => p.evaluate(inPage(f, `Array.from(document.querySelectorAll(${JSON.stringify(sel)}))`, arg)),
    waitForSelector: (sel, { timeout } = {}) => visible(sel, timeout),
    // Polled every 30 ms rather than per animation frame, which a headless
    // Firefox may throttle.
    waitForFunction: (f, arg, { timeout = 30000 } = {}) => p.waitForFunction(f, { timeout, polling: 30 }, arg),
    waitForTimeout: (ms) => new Promise((r) => setTimeout(r, ms)),
    fill: async (sel, value) => (await visible(sel)).evaluate((el, v) => {
      el.value = v;
      el.dispatchEvent(new Event("input", { bubbles: true }));
      el.dispatchEvent(new Event("change", { bubbles: true }));
    }, value),
    click: async (sel) => (await visible(sel)).click(),
    textContent: async (sel) => (await p.waitForSelector(sel, { timeout: 30000 })).evaluate((el) => el.textContent),
    selectOption: async (sel, value) => {
      await visible(sel);
      await p.select(sel, value);
    },
    screenshot: (opts) => p.screenshot(opts),
  };
}
