//! `cargo xtask harnesses`: installs the harness CLIs the end-to-end
//! tests run, from the npm registry, at the versions pinned in
//! `harnesses/package.json` (with `harnesses/package-lock.json` for their
//! dependencies): the one place their versions are set. The demo installs
//! Claude Code alone ([`claude_code`]), from the same pins. The Python
//! harnesses ([`python::HARNESSES`]) each get a virtual environment of their own in
//! `venvs/` beside the npm prefix, from their lock file in
//! `python/requirements/` ([`crate::python`]), made while npm installs
//! the CLIs.
//!
//! The six go to `.polar-cache/harnesses/` (git-ignored; `POLAR_HARNESS_DIR`
//! overrides it), Claude Code alone to `.polar-cache/claude-code/`, reused
//! between runs: a stamp holding the manifest and lock file it was installed
//! from makes a second run a no-op, and any change to either reinstalls.
//! `npm install` (not `npm ci`, which refuses lock files whose optional
//! platform packages were left out) follows the lock file.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow, bail};
use serde_json::{Map, Value, json};

use crate::cmd::{Cmd, workspace_root};
use crate::{python, setup};

/// The binaries the npm-installed CLIs install.
pub const BINARIES: [&str; 7] = [
    "codex", "claude", "gemini", "qwen", "opencode", "pi", "copilot",
];
/// Claude Code's npm package and binary.
const CLAUDE_PACKAGE: &str = "@anthropic-ai/claude-code";
const CLAUDE_BINARY: &str = "claude";
const STAMP: &str = ".polar-installed";
/// The oldest Node all six pinned CLIs run on.
const NODE_MAJOR: u32 = 20;
/// Debian's packages for Node and npm (Node 18 on Debian 12).
const NODE_APT_PACKAGES: [&str; 2] = ["nodejs", "npm"];

/// Where the six CLIs are installed.
pub fn install_dir() -> Result<PathBuf> {
    Ok(match std::env::var_os("POLAR_HARNESS_DIR") {
        Some(d) => PathBuf::from(d),
        None => workspace_root()?.join(".polar-cache/harnesses"),
    })
}

fn report(item: &str, state: &str) {
    eprintln!("harnesses: {item:<18} {state}");
}

fn node_major() -> Option<u32> {
    let v = Cmd::new("node").ok()?.arg("--version").probe()?;
    v.trim()
        .trim_start_matches('v')
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// One npm prefix to install: a manifest, its lock file, and the binaries
/// it must end up with (also the dashboard tests' playwright-core,
/// `crate::dashboard`).
pub struct Install<'a> {
    pub what: &'a str,
    pub dir: PathBuf,
    pub manifest: String,
    pub lock: String,
    pub binaries: &'a [&'a str],
}

impl Install<'_> {
    fn stamp(&self) -> String {
        format!("{}\n{}", self.manifest, self.lock)
    }

    /// Whether it is installed from this manifest and lock file.
    pub fn is_current(&self) -> bool {
        let bins = self.dir.join("node_modules/.bin");
        std::fs::read_to_string(self.dir.join(STAMP)).is_ok_and(|s| s == self.stamp())
            && self.binaries.iter().all(|b| bins.join(b).exists())
    }

    /// `npm install` into the prefix, then `--version` of every binary.
    pub fn npm_install(&self) -> Result<()> {
        let dir = &self.dir;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let _ = std::fs::remove_file(dir.join(STAMP));
        std::fs::write(dir.join("package.json"), &self.manifest)?;
        std::fs::write(dir.join("package-lock.json"), &self.lock)?;
        Cmd::new("npm")?
            .arg("--prefix")
            .arg(dir)
            .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
            .run()
            .with_context(|| format!("npm install of {} failed", self.what))?;
        let bins = dir.join("node_modules/.bin");
        for b in self.binaries {
            check(&bins, b)?;
        }
        std::fs::write(dir.join(STAMP), self.stamp())?;
        report(self.what, "installed");
        Ok(())
    }
}

/// The pinned manifest and lock file.
fn pins() -> Result<(String, String)> {
    let src = workspace_root()?.join("harnesses");
    let manifest = std::fs::read_to_string(src.join("package.json"))
        .context("reading harnesses/package.json")?;
    let lock = std::fs::read_to_string(src.join("package-lock.json"))
        .context("reading harnesses/package-lock.json")?;
    Ok((manifest, lock))
}

fn all_six() -> Result<Install<'static>> {
    let (manifest, lock) = pins()?;
    Ok(Install {
        what: "harness CLIs",
        dir: install_dir()?,
        manifest,
        lock,
        binaries: &BINARIES,
    })
}

/// Installs the CLIs and the Python harnesses' environments if they are
/// missing or out of date, the environments at the same time as the npm
/// CLIs (npm and pip each wait on the registry most of the time); returns
/// where the CLIs are.
pub fn run() -> Result<PathBuf> {
    let dir = install_dir()?;
    std::thread::scope(|s| {
        let venvs = s.spawn(|| python_harnesses(&dir));
        let npm = npm_harnesses().and_then(|npm| copilot_dist(&npm).map(|()| npm));
        venvs
            .join()
            .map_err(|_| anyhow!("making the Python harnesses' environments panicked"))?
            .context("making the Python harnesses' environments")?;
        npm
    })
}

/// Where Copilot CLI's JavaScript package is unpacked in the npm prefix
/// (the agent's `harness::COPILOT_DIST`).
const COPILOT_DIST: &str = "copilot-dist";

/// The `version` of a `package.json`.
fn package_version(path: &Path) -> Option<String> {
    let v: Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    v["version"].as_str().map(str::to_owned)
}

/// Unpacks Copilot CLI's JavaScript package, which its binary carries and
/// otherwise unpacks into `~/.cache/copilot` (235 MB) on its first start in
/// every session, once into `copilot-dist/` of the npm prefix `dir`: its
/// loader runs it from there when `COPILOT_CLI_DIST_DIR` names it (the
/// agent sets it when the copy is of the installed version). Unpacked by
/// the binary itself (`copilot help providers` with a HOME and cache of
/// its own, offline), so the copy is exactly what it would unpack.
fn copilot_dist(dir: &Path) -> Result<()> {
    let item = "copilot package";
    let installed = package_version(&dir.join("node_modules/@github/copilot/package.json"))
        .context("Copilot CLI is installed without a readable package.json")?;
    let dist = dir.join(COPILOT_DIST);
    if package_version(&dist.join("package.json")).as_ref() == Some(&installed)
        && dist.join("index.js").is_file()
    {
        report(item, "present");
        return Ok(());
    }
    let work = dir.join(format!("{COPILOT_DIST}.tmp"));
    if work.exists() {
        std::fs::remove_dir_all(&work)?;
    }
    let (home, cache) = (work.join("home"), work.join("cache"));
    std::fs::create_dir_all(&home)?;
    std::fs::create_dir_all(&cache)?;
    let run = Cmd::new(dir.join("node_modules/.bin/copilot"))?
        .args(["help", "providers"])
        .env("HOME", &home)
        .env("XDG_CACHE_HOME", &cache)
        .env("COPILOT_OFFLINE", "true")
        .env("COPILOT_AUTO_UPDATE", "false")
        .capture(std::time::Duration::from_secs(300))?;
    if !run.status.success() {
        bail!(
            "unpacking Copilot CLI's package failed: {}",
            run.stderr.trim()
        );
    }
    // cache/copilot/pkg/<platform>/<version>/
    let unpacked = std::fs::read_dir(cache.join("copilot/pkg"))
        .context("Copilot CLI unpacked no package")?
        .filter_map(|e| e.ok().map(|e| e.path().join(&installed)))
        .find(|p| p.join("index.js").is_file())
        .ok_or_else(|| anyhow!("Copilot CLI unpacked no package of version {installed}"))?;
    if dist.exists() {
        std::fs::remove_dir_all(&dist)?;
    }
    std::fs::rename(&unpacked, &dist)?;
    std::fs::remove_dir_all(&work)?;
    report(item, &format!("unpacked ({installed})"));
    Ok(())
}

/// Makes each Python harness's environment in `venvs/` beside the npm
/// prefix `dir`.
fn python_harnesses(dir: &Path) -> Result<()> {
    let venvs = dir
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent directory", dir.display()))?
        .join("venvs");
    for venv in python::HARNESSES {
        venv.ensure_at(&venvs.join(venv.name))?;
    }
    Ok(())
}

/// Installs the npm-installed CLIs if they are missing or out of date.
fn npm_harnesses() -> Result<PathBuf> {
    let six = all_six()?;
    if six.is_current() {
        report(six.what, "present");
        return Ok(six.dir);
    }
    match node_major() {
        Some(v) if v >= NODE_MAJOR => {}
        Some(v) => {
            bail!("the harness CLIs need Node {NODE_MAJOR} or later; `node --version` says {v}")
        }
        None => {
            bail!("the harness CLIs need Node {NODE_MAJOR} or later and npm; `node` was not found")
        }
    }
    six.npm_install()?;
    Ok(six.dir)
}

/// Installs Claude Code alone, at its pinned version, into
/// `.polar-cache/claude-code` if it is missing or out of date (with Debian's
/// Node and npm if there are none), and returns the npm prefix to run it
/// from. When the six CLIs are already installed and current, returns
/// theirs instead.
pub fn claude_code() -> Result<PathBuf> {
    let six = all_six()?;
    if six.is_current() {
        report("claude", &format!("present (in {})", six.dir.display()));
        return Ok(six.dir);
    }
    let (manifest, lock) = subset(&six.manifest, &six.lock, CLAUDE_PACKAGE)?;
    let min_node = node_engine(&lock, CLAUDE_PACKAGE).unwrap_or(NODE_MAJOR);
    let claude = Install {
        what: "claude",
        dir: workspace_root()?.join(".polar-cache/claude-code"),
        manifest,
        lock,
        binaries: &[CLAUDE_BINARY],
    };
    if claude.is_current() {
        report(claude.what, "present");
        return Ok(claude.dir);
    }
    node_and_npm(min_node)?;
    claude.npm_install()?;
    Ok(claude.dir)
}

/// Makes sure `node` (at least `min_major`) and `npm` run, installing
/// Debian's packages when either is missing.
pub fn node_and_npm(min_major: u32) -> Result<()> {
    let npm = || {
        Cmd::new("npm")
            .ok()
            .and_then(|c| c.arg("--version").probe())
    };
    if node_major().is_none() || npm().is_none() {
        setup::apt_packages(&NODE_APT_PACKAGES)
            .context("installing Node and npm (Debian's nodejs and npm)")?;
    }
    match (node_major(), npm()) {
        (Some(v), Some(_)) if v >= min_major => {
            report("node, npm", &format!("present (node {v})"));
            Ok(())
        }
        (Some(v), Some(_)) => {
            bail!("this needs Node {min_major} or later; `node --version` says {v}")
        }
        _ => {
            bail!("`node --version` or `npm --version` still fails after installing nodejs and npm")
        }
    }
}

/// The manifest and lock file of `package` alone, cut out of the pinned
/// ones: `package` at its pinned version and, from the lock file, exactly
/// the packages it needs (npm's lookup: the nearest `node_modules/NAME`
/// upwards from the package that asks for it).
fn subset(manifest: &str, lock: &str, package: &str) -> Result<(String, String)> {
    let manifest: Value = serde_json::from_str(manifest).context("harnesses/package.json")?;
    let lock: Value = serde_json::from_str(lock).context("harnesses/package-lock.json")?;
    let version = manifest["dependencies"][package]
        .as_str()
        .ok_or_else(|| anyhow!("harnesses/package.json does not pin {package}"))?;
    let packages = lock["packages"]
        .as_object()
        .ok_or_else(|| anyhow!("harnesses/package-lock.json has no `packages`"))?;
    let mut kept = Map::new();
    let mut todo = vec![(String::new(), package.to_owned(), false)];
    while let Some((from, name, optional)) = todo.pop() {
        let Some(path) = lookup(packages, &from, &name) else {
            if optional {
                continue;
            }
            bail!("harnesses/package-lock.json has no entry for {name} (needed by {from:?})");
        };
        if kept.contains_key(&path) {
            continue;
        }
        let entry = &packages[&path];
        for (field, optional) in [
            ("dependencies", false),
            ("optionalDependencies", true),
            ("peerDependencies", true),
        ] {
            if let Some(deps) = entry[field].as_object() {
                todo.extend(deps.keys().map(|d| (path.clone(), d.clone(), optional)));
            }
        }
        kept.insert(path, entry.clone());
    }
    let name = format!(
        "polar-{}",
        package.trim_start_matches('@').replace('/', "-")
    );
    let dependencies = json!({ package: version });
    let root = json!({ "name": name, "license": "UNLICENSED", "dependencies": dependencies });
    let mut all = Map::from_iter([(String::new(), root)]);
    // Sorted, as npm writes them, so that the stamp does not depend on
    // the order of the walk.
    let mut kept: Vec<_> = kept.into_iter().collect();
    kept.sort_by(|a, b| a.0.cmp(&b.0));
    all.extend(kept);
    let manifest = json!({
        "name": name,
        "private": true,
        "description": format!("{package} alone, cut out of harnesses/ by `cargo xtask demo`."),
        "license": "UNLICENSED",
        "dependencies": dependencies,
    });
    let lock = json!({
        "name": name,
        "lockfileVersion": lock["lockfileVersion"],
        "requires": true,
        "packages": all,
    });
    Ok((
        serde_json::to_string_pretty(&manifest)? + "\n",
        serde_json::to_string_pretty(&lock)? + "\n",
    ))
}

/// Where npm finds `name` for the package at `from` ("" for the root).
fn lookup(packages: &Map<String, Value>, from: &str, name: &str) -> Option<String> {
    let mut base = from;
    loop {
        let path = if base.is_empty() {
            format!("node_modules/{name}")
        } else {
            format!("{base}/node_modules/{name}")
        };
        if packages.contains_key(&path) {
            return Some(path);
        }
        if base.is_empty() {
            return None;
        }
        base = base.rfind("/node_modules/").map_or("", |i| &base[..i]);
    }
}

/// The major version in `engines.node` of `package` in `lock` when it reads
/// `>=N...`.
fn node_engine(lock: &str, package: &str) -> Option<u32> {
    let lock: Value = serde_json::from_str(lock).ok()?;
    let wanted = lock["packages"][format!("node_modules/{package}")]["engines"]["node"].as_str()?;
    wanted
        .trim()
        .strip_prefix(">=")?
        .trim()
        .split('.')
        .next()?
        .parse()
        .ok()
}

fn check(bins: &Path, binary: &str) -> Result<()> {
    let path = bins.join(binary);
    let run = Cmd::new(&path)?
        .arg("--version")
        .capture(std::time::Duration::from_secs(60))?;
    if !run.status.success() {
        bail!(
            "{} --version failed after the install: {}",
            path.display(),
            run.stderr.trim()
        );
    }
    // pi prints its version on stderr.
    let text = if run.stdout.trim().is_empty() {
        run.stderr
    } else {
        run.stdout
    };
    report(binary, text.lines().next().unwrap_or_default().trim());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = r#"{"name": "h", "dependencies": {"a": "1.0.0", "b": "2.0.0"}}"#;
    const LOCK: &str = r#"{
      "name": "h", "lockfileVersion": 3, "requires": true,
      "packages": {
        "": {"name": "h", "dependencies": {"a": "1.0.0", "b": "2.0.0"}},
        "node_modules/a": {"version": "1.0.0", "engines": {"node": ">=18.0.0"},
          "dependencies": {"c": "^1"}, "optionalDependencies": {"a-linux": "1.0.0", "a-gone": "1"}},
        "node_modules/a-linux": {"version": "1.0.0", "optional": true},
        "node_modules/a/node_modules/c": {"version": "1.5.0", "dependencies": {"d": "^1"}},
        "node_modules/b": {"version": "2.0.0", "dependencies": {"c": "^2"}},
        "node_modules/c": {"version": "2.0.0"},
        "node_modules/d": {"version": "1.0.0"}
      }
    }"#;

    #[test]
    fn the_subset_keeps_exactly_what_the_package_needs() {
        let (manifest, lock) = subset(MANIFEST, LOCK, "a").unwrap();
        let manifest: Value = serde_json::from_str(&manifest).unwrap();
        assert_eq!(manifest["dependencies"], json!({"a": "1.0.0"}));
        let lock: Value = serde_json::from_str(&lock).unwrap();
        let kept: Vec<&String> = lock["packages"].as_object().unwrap().keys().collect();
        assert_eq!(
            kept,
            [
                "",
                "node_modules/a",
                "node_modules/a-linux",
                "node_modules/a/node_modules/c",
                "node_modules/d",
            ]
        );
        assert_eq!(lock["packages"][""]["dependencies"], json!({"a": "1.0.0"}));
        assert_eq!(lock["lockfileVersion"], 3);
        assert!(subset(MANIFEST, LOCK, "zzz").is_err());
    }

    #[test]
    fn the_node_engine_is_read_from_the_lock_file() {
        assert_eq!(node_engine(LOCK, "a"), Some(18));
        assert_eq!(node_engine(LOCK, "b"), None);
    }

    #[test]
    fn claude_code_is_pinned_in_harnesses() {
        let (manifest, lock) = pins().unwrap();
        let (manifest, lock) = subset(&manifest, &lock, CLAUDE_PACKAGE).unwrap();
        assert!(manifest.contains(CLAUDE_PACKAGE));
        let lock: Value = serde_json::from_str(&lock).unwrap();
        let kept = lock["packages"].as_object().unwrap();
        assert!(kept.contains_key("node_modules/@anthropic-ai/claude-code-linux-x64"));
        assert!(
            kept.keys()
                .all(|k| k.is_empty() || k.contains("claude-code")),
            "{kept:?}"
        );
    }
}
