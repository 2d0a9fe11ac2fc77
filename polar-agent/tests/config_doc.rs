//! docs/CONFIG.md stays true to the config types: every TOML block in it is
//! a valid configuration (parsed and validated by the real code, unknown
//! keys refused), every key its tables list exists, and every key the types
//! accept is listed. The keys the types accept are asked of the types
//! themselves: each table is given an unknown key, and serde's refusal
//! lists the fields it expected.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed step fails the test"
)]

use std::collections::BTreeSet;

use polar_config::{Config, RawConfig};
use polar_node::gateway::GatewayConfig;
use polar_rollout::RolloutConfig;

fn doc() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/CONFIG.md")).unwrap()
}

/// The TOML of a table path with an unknown key in it.
fn probe_toml(table: &str) -> String {
    let k = "zz_probe = 1";
    match table {
        "" => k.to_owned(),
        "route[]" => format!("[[route]]\n{k}"),
        "backend[]" => format!("[[backend]]\n{k}"),
        t if t.starts_with("backend[].sampling") => {
            let inner = t.trim_start_matches("backend[].sampling");
            format!(
                "[[backend]]\nname = \"b\"\ndialect = \"vllm\"\nreplicas = []\nserved_model = \"m\"\n\
                 [backend.sampling{inner}]\n{k}"
            )
        }
        t => format!("[{t}]\n{k}"),
    }
}

/// The fields serde expected in `table`, from its refusal of an unknown key.
/// `[gateway]` and `[rollout]` are opaque to the agent's types: their own
/// parsers are asked.
fn fields_of(table: &str) -> Vec<String> {
    let text = probe_toml(table);
    let msg = if table.starts_with("gateway") {
        let required = "[gateway]\nserver = \"http://s\"\ntoken = \"t\"\n";
        let probe = match table {
            "gateway" => format!("{required}zz_probe = 1"),
            _ => format!("{required}{text}"),
        };
        GatewayConfig::from_toml_str(&probe)
            .unwrap_err()
            .to_string()
    } else if table.starts_with("rollout") {
        RolloutConfig::from_toml(&text, None)
            .unwrap_err()
            .to_string()
    } else {
        toml::from_str::<RawConfig>(&text)
            .unwrap_err()
            .message()
            .to_owned()
    };
    assert!(msg.contains("unknown field `zz_probe`"), "{table}: {msg}");
    let expected = msg.split_once("expected ").unwrap().1;
    expected
        .split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s.to_owned())
        .collect()
}

const TABLES: &[&str] = &[
    "",
    "agent",
    "proxy",
    "ca",
    "dns",
    "sandbox",
    "route[]",
    "backend[]",
    "backend[].sampling",
    "backend[].sampling.train",
    "backend[].sampling.eval",
    "gateway",
    "gateway.s3",
    "gateway.policy",
    "gateway.tls",
    "rollout",
    "rollout.callback",
    "rollout.tls",
    "rollout.dashboard",
    "rollout.dashboard.s3",
    "harness.NAME",
];

/// Every key the types accept, as `table.key` paths.
fn type_keys() -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for t in TABLES {
        for f in fields_of(t) {
            let path = if t.is_empty() { f } else { format!("{t}.{f}") };
            keys.insert(path);
        }
    }
    keys
}

/// The keys the doc's tables list (first cell of each row, in backticks).
fn doc_keys(doc: &str) -> BTreeSet<String> {
    doc.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(k, _)| k.to_owned()))
        .collect()
}

fn toml_blocks(doc: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```toml") => current = Some(String::new()),
            (Some(b), "```") => {
                blocks.push(std::mem::take(b));
                current = None;
            }
            (Some(b), l) => {
                b.push_str(l);
                b.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn every_key_of_the_types_is_documented_and_every_documented_key_exists() {
    let types = type_keys();
    // Sanity: the probe sees the known keys of every table.
    for k in [
        "default_action",
        "agent.state_dir",
        "route[].host",
        "backend[].sampling.eval.top_k",
        "gateway.running_workers",
        "gateway.s3.endpoint",
        "rollout.callback.max_attempts",
    ] {
        assert!(types.contains(k), "{k} not found by the probe: {types:?}");
    }
    // Tables are keys too (`agent`, `route`, ...): list them by their name.
    let documented: BTreeSet<String> = doc_keys(&doc());
    let undocumented: Vec<&String> = types.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "keys missing from docs/CONFIG.md: {undocumented:?}"
    );
    let unknown: Vec<&String> = documented.difference(&types).collect();
    assert!(
        unknown.is_empty(),
        "docs/CONFIG.md lists keys that do not exist: {unknown:?}"
    );
}

#[test]
fn every_toml_block_of_the_doc_is_a_valid_configuration() {
    let blocks = toml_blocks(&doc());
    assert!(blocks.len() >= 2, "{blocks:?}");
    let mut used = BTreeSet::new();
    for b in &blocks {
        if let Err(e) = Config::from_toml_str(b) {
            panic!("{e}\nin:\n{b}");
        }
        if let Err(e) = GatewayConfig::from_toml_str(b) {
            panic!("{e}\nin:\n{b}");
        }
        if b.contains("[rollout]")
            && let Err(e) = RolloutConfig::from_toml(b, None)
        {
            panic!("{e}\nin:\n{b}");
        }
        // Which keys the examples use (top-level and one level down).
        let v: toml::Table = toml::from_str(b).unwrap();
        for (k, val) in &v {
            used.insert(k.clone());
            if let Some(t) = val.as_table() {
                used.extend(t.keys().map(|s| format!("{k}.{s}")));
            }
            if let Some(a) = val.as_array() {
                for item in a.iter().filter_map(toml::Value::as_table) {
                    used.extend(item.keys().map(|s| format!("{k}[].{s}")));
                }
            }
        }
    }
    // The first example shows every key of the flat tables and of the
    // arrays of tables.
    for k in type_keys() {
        if k.matches('.').count() <= 1 {
            assert!(used.contains(&k), "no example uses {k}");
        }
    }
}
