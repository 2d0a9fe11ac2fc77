//! The layer check on small synthetic `cargo metadata` output.

use serde_json::{Value, json};

use super::check::{Rule, Violation};
use super::*;

/// A synthetic workspace: members and external packages, each with its
/// dependencies as `(name, kind)`, kind one of `""` (normal), `"build"`,
/// `"dev"`. Declared and resolved dependencies are the same.
#[derive(Default)]
struct Meta {
    members: Vec<(&'static str, Vec<(&'static str, &'static str)>)>,
    externals: Vec<(&'static str, Vec<(&'static str, &'static str)>)>,
}

impl Meta {
    fn member(mut self, name: &'static str, deps: &[(&'static str, &'static str)]) -> Self {
        self.members.push((name, deps.to_vec()));
        self
    }

    fn external(mut self, name: &'static str, deps: &[(&'static str, &'static str)]) -> Self {
        self.externals.push((name, deps.to_vec()));
        self
    }

    fn id(&self, name: &str) -> String {
        if self.members.iter().any(|(m, _)| *m == name) {
            format!("path+file:///ws/{name}#0.1.0")
        } else {
            format!("registry+https://github.com/rust-lang/crates.io-index#{name}@1.0.0")
        }
    }

    fn json(&self) -> String {
        let kind = |k: &str| if k.is_empty() { Value::Null } else { json!(k) };
        let all: Vec<_> = self.members.iter().chain(&self.externals).collect();
        let packages: Vec<Value> = all
            .iter()
            .map(|(name, deps)| {
                json!({
                    "id": self.id(name),
                    "name": name,
                    "manifest_path": format!("/ws/{name}/Cargo.toml"),
                    "dependencies": deps.iter().map(|(d, k)| json!({
                        "name": d, "kind": kind(k), "optional": false,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let nodes: Vec<Value> = all
            .iter()
            .map(|(name, deps)| {
                json!({
                    "id": self.id(name),
                    "deps": deps.iter().map(|(d, k)| json!({
                        "name": d.replace('-', "_"),
                        "pkg": self.id(d),
                        "dep_kinds": [{"kind": kind(k), "target": null}],
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({
            "packages": packages,
            "workspace_members": self.members.iter().map(|(n, _)| self.id(n)).collect::<Vec<_>>(),
            "workspace_root": "/ws",
            "resolve": {"nodes": nodes, "root": null},
        })
        .to_string()
    }

    fn check(&self) -> Vec<Violation> {
        let ws = Workspace::parse(&self.json()).unwrap();
        check(&ws, LAYERS)
    }
}

/// The workspace as it was before the split: the agent still holds the
/// export, rollout and capture code and their dependencies.
fn before_split() -> Meta {
    Meta::default()
        .member(
            "polar-agent",
            &[
                ("polar-common", ""),
                ("polar-ebpf", "build"),
                ("aya-build", "build"),
                ("tokio", ""),
                ("aya", ""),
                ("libc", ""),
                ("parquet", ""),
                ("arrow-array", ""),
                ("object_store", ""),
                ("rusqlite", ""),
                ("proptest", "dev"),
            ],
        )
        .member("polar-common", &[("aya", "")])
        .member("polar-ebpf", &[("polar-common", ""), ("aya-ebpf", "")])
        .member("polar-tests", &[("polar-agent", ""), ("tokio", "")])
        .member("xtask", &[("serde_json", "")])
        .external("tokio", &[("libc", "")])
        .external("aya", &[("libc", ""), ("object", "")])
        .external("aya-build", &[])
        .external("aya-ebpf", &[])
        .external("libc", &[])
        .external("object", &[])
        .external("parquet", &[("arrow-array", "")])
        .external("arrow-array", &[])
        .external("object_store", &[("hyper", "")])
        .external("hyper", &[("tokio", "")])
        .external("rusqlite", &[])
        .external("proptest", &[])
        .external("serde_json", &[])
}

/// The workspace after the split, as the table describes it: every row,
/// each depending on what its row allows.
fn after_split() -> Meta {
    let mut meta = Meta::default();
    for layer in LAYERS {
        let mut deps: Vec<(&'static str, &'static str)> = match layer.may_use {
            Allowed::Only(list) => list.iter().map(|d| (*d, "")).collect(),
            Allowed::Above => LAYERS
                .iter()
                .take_while(|l| l.name != layer.name)
                .filter(|l| !layer.build_only.contains(&l.name))
                .map(|l| (l.name, ""))
                .collect(),
            Allowed::Any => vec![("polar-agent", "")],
        };
        deps.extend(layer.build_only.iter().map(|d| (*d, "build")));
        match layer.name {
            "polar-common" => deps.push(("aya", "")),
            "polar-io" => deps.extend([("tokio", ""), ("hyper", "")]),
            "polar-export" => deps.extend([("parquet", ""), ("arrow-array", "")]),
            "polar-rollout" => deps.push(("rusqlite", "")),
            "polar-redirect" => deps.extend([("aya", ""), ("aya-build", "build"), ("libc", "")]),
            "polar-agent" => deps.push(("libc", "")),
            "polar-json" => deps.push(("serde_json", "")),
            // A dev-dependency on a crate below that does not depend on it.
            "polar-metrics" => deps.push(("polar-rollout-api", "dev")),
            _ => {}
        }
        meta = meta.member(layer.name, &deps);
    }
    meta.external("tokio", &[("libc", "")])
        .external("hyper", &[("tokio", "")])
        .external("aya", &[("libc", "")])
        .external("aya-build", &[])
        .external("libc", &[])
        .external("parquet", &[("arrow-array", "")])
        .external("arrow-array", &[])
        .external("rusqlite", &[])
        .external("serde_json", &[])
}

fn rules(violations: &[Violation]) -> Vec<(Rule, &str, &str)> {
    violations
        .iter()
        .map(|v| (v.rule, v.krate.as_str(), v.dependency.as_str()))
        .collect()
}

#[test]
fn the_workspace_before_and_after_the_split_passes() {
    assert_eq!(before_split().check(), vec![]);
    assert_eq!(after_split().check(), vec![]);
}

#[test]
fn a_member_without_a_row_fails() {
    let v = before_split().member("polar-new", &[]).check();
    assert_eq!(rules(&v), [(Rule::Undeclared, "polar-new", "")]);
    assert!(
        v[0].to_string()
            .contains("without a row in the layer table"),
        "{}",
        v[0]
    );
}

#[test]
fn a_workspace_dependency_outside_the_row_fails() {
    let mut meta = after_split();
    meta.members
        .iter_mut()
        .filter(|(n, _)| *n == "polar-chat")
        .for_each(|(_, deps)| deps.push(("polar-ids", "")));
    let v = meta.check();
    assert_eq!(rules(&v), [(Rule::NotInRow, "polar-chat", "polar-ids")]);
    let text = v[0].to_string();
    assert!(
        text.starts_with("polar-chat -> polar-ids [row-allows-dependency]: polar-chat (pure) may depend on polar-json, polar-sse, not on polar-ids (pure)"),
        "{text}"
    );
}

#[test]
fn a_build_only_crate_as_a_normal_dependency_fails() {
    let mut meta = before_split();
    meta.members[0].1[1] = ("polar-ebpf", "");
    let v = meta.check();
    assert_eq!(rules(&v), [(Rule::BuildOnly, "polar-agent", "polar-ebpf")]);
}

#[test]
fn a_pure_crate_reaching_io_fails_even_indirectly() {
    let v = Meta::default()
        .member("polar-json", &[("serde_json", ""), ("tokio", "dev")])
        .member("polar-sse", &[("helper", "")])
        .member("polar-chat", &[("polar-json", ""), ("polar-sse", "")])
        .external("serde_json", &[])
        .external("tokio", &[])
        .external("helper", &[("hyper", "")])
        .external("hyper", &[("tokio", "")])
        .check();
    assert_eq!(
        rules(&v),
        [
            (Rule::PureIo, "polar-sse", "hyper"),
            (Rule::PureIo, "polar-sse", "tokio"),
            (Rule::PureIo, "polar-chat", "hyper"),
            (Rule::PureIo, "polar-chat", "tokio"),
        ]
    );
    assert!(
        v[3].to_string()
            .ends_with("it comes in through polar-chat -> polar-sse -> helper -> hyper -> tokio"),
        "{}",
        v[3]
    );
}

#[test]
fn a_pure_crate_on_polar_io_or_libc_fails_but_libc_further_down_does_not() {
    let v = Meta::default()
        .member("polar-io", &[])
        .member("polar-ids", &[("polar-io", ""), ("libc", "")])
        .member("polar-json", &[("getrandom", "")])
        .external("libc", &[])
        .external("getrandom", &[("libc", "")])
        .check();
    assert_eq!(
        rules(&v),
        [
            (Rule::NotInRow, "polar-ids", "polar-io"),
            (Rule::PureIo, "polar-ids", "libc"),
            (Rule::PureIo, "polar-ids", "polar-io"),
        ]
    );
}

#[test]
fn the_exempt_aya_of_polar_common_is_not_followed() {
    // polar-json -> polar-common is outside the row, but reaching aya
    // through polar-common's optional dependency is not an I/O violation.
    let v = Meta::default()
        .member("polar-common", &[("aya", "")])
        .member("polar-json", &[("polar-common", "")])
        .external("aya", &[])
        .check();
    assert_eq!(rules(&v), [(Rule::NotInRow, "polar-json", "polar-common")]);
}

#[test]
fn owned_dependencies_belong_to_their_crates_once_these_exist() {
    let mut meta = before_split().member("polar-export", &[("parquet", "")]);
    let v = meta.check();
    assert_eq!(
        rules(&v),
        [
            (Rule::Owned, "polar-agent", "parquet"),
            (Rule::Owned, "polar-agent", "arrow-array"),
            (Rule::Owned, "polar-agent", "object_store"),
        ]
    );
    assert!(
        v[0].to_string()
            .contains("only polar-export may depend directly on arrow-*, parquet, object_store"),
        "{}",
        v[0]
    );
    meta = after_split();
    for (name, dep) in [
        ("polar-capture", "rusqlite"),
        ("polar-capture", "arrow-schema"),
        ("polar-io", "aya"),
    ] {
        meta.members
            .iter_mut()
            .filter(|(n, _)| *n == name)
            .for_each(|(_, deps)| deps.push((dep, "")));
    }
    let v = meta.external("arrow-schema", &[]).check();
    let owned: Vec<_> = rules(&v)
        .into_iter()
        .filter(|(r, _, _)| *r == Rule::Owned)
        .collect();
    assert_eq!(
        owned,
        [
            (Rule::Owned, "polar-io", "aya"),
            (Rule::Owned, "polar-capture", "rusqlite"),
            (Rule::Owned, "polar-capture", "arrow-schema"),
        ]
    );
}

#[test]
fn library_crates_must_not_reach_the_ebpf_side() {
    let mut meta = after_split();
    meta.members
        .iter_mut()
        .filter(|(n, _)| *n == "polar-io")
        .for_each(|(_, deps)| deps.push(("bpf-helper", "")));
    let v = meta
        .external("bpf-helper", &[("aya-build", "build")])
        .check();
    let stable: Vec<_> = rules(&v)
        .into_iter()
        .filter(|(r, _, _)| *r == Rule::StableOnly)
        .collect();
    // Every library crate above polar-io, the rollout server and the mock
    // among them.
    assert_eq!(
        stable,
        [
            (Rule::StableOnly, "polar-io", "aya-build"),
            (Rule::StableOnly, "polar-inference", "aya-build"),
            (Rule::StableOnly, "polar-mock", "aya-build"),
            (Rule::StableOnly, "polar-capture", "aya-build"),
            (Rule::StableOnly, "polar-export", "aya-build"),
            (Rule::StableOnly, "polar-evaluate", "aya-build"),
            (Rule::StableOnly, "polar-rollout-api", "aya-build"),
            (Rule::StableOnly, "polar-gateway", "aya-build"),
            (Rule::StableOnly, "polar-rollout", "aya-build"),
            (Rule::StableOnly, "polar-config", "aya-build"),
            (Rule::StableOnly, "polar-tls", "aya-build"),
        ]
    );
    let text = v
        .iter()
        .find(|v| v.krate == "polar-rollout")
        .unwrap()
        .to_string();
    assert!(
        text.ends_with("through polar-rollout -> polar-io -> bpf-helper -> aya-build"),
        "{text}"
    );
}

#[test]
fn only_the_tests_depend_on_the_agent() {
    let mut meta = after_split();
    meta.members
        .iter_mut()
        .filter(|(n, _)| *n == "polar-export" || *n == "xtask")
        .for_each(|(_, deps)| deps.push(("polar-agent", "")));
    let v = meta.check();
    assert_eq!(
        rules(&v),
        [
            (Rule::AgentDependent, "polar-export", "polar-agent"),
            (Rule::StableOnly, "polar-export", "polar-agent"),
            (Rule::StableOnly, "polar-export", "polar-redirect"),
            (Rule::StableOnly, "polar-export", "polar-ebpf"),
            (Rule::StableOnly, "polar-export", "aya"),
            (Rule::StableOnly, "polar-export", "aya-build"),
            // The rollout server reads exports: the edge reaches it too.
            (Rule::StableOnly, "polar-rollout", "polar-agent"),
            (Rule::StableOnly, "polar-rollout", "polar-redirect"),
            (Rule::StableOnly, "polar-rollout", "polar-ebpf"),
            (Rule::StableOnly, "polar-rollout", "aya"),
            (Rule::StableOnly, "polar-rollout", "aya-build"),
            (Rule::AgentDependent, "xtask", "polar-agent"),
            (Rule::Cycle, "polar-agent", "polar-export"),
            (Rule::Cycle, "polar-rollout", "polar-export"),
            (Rule::Cycle, "polar-node", "polar-export"),
        ]
    );
    assert!(
        v[0].to_string()
            .contains("only the tests crate may depend on polar-agent")
    );
}

#[test]
fn cycles_are_reported_dev_dependencies_included() {
    let v = Meta::default()
        .member("polar-json", &[("polar-chat", "dev")])
        .member("polar-sse", &[])
        .member("polar-chat", &[("polar-json", ""), ("polar-sse", "")])
        .check();
    assert_eq!(rules(&v), [(Rule::Cycle, "polar-chat", "polar-json")]);
    assert!(
        v[0].to_string()
            .ends_with("polar-json -> polar-chat (dev) -> polar-json"),
        "{}",
        v[0]
    );
    let v = Meta::default()
        .member("polar-json", &[("polar-sse", "")])
        .member("polar-sse", &[("polar-json", "")])
        .check();
    let cycles: Vec<_> = v.iter().filter(|v| v.rule == Rule::Cycle).collect();
    assert_eq!(cycles.len(), 1, "{v:?}");
}

#[test]
fn the_table_is_layered() {
    for (i, layer) in LAYERS.iter().enumerate() {
        assert!(
            !LAYERS[..i].iter().any(|l| l.name == layer.name),
            "{} has two rows",
            layer.name
        );
        if let Allowed::Only(list) = layer.may_use {
            for dep in list {
                assert!(
                    LAYERS[..i].iter().any(|l| l.name == *dep),
                    "{} may use {dep}, which has no row above it",
                    layer.name
                );
            }
        }
    }
}

#[test]
fn the_graph_is_rendered_in_table_order_and_replaces_the_block() {
    let ws = Workspace::parse(&before_split().json()).unwrap();
    let block = graph::render(&ws, LAYERS);
    let rows: Vec<&str> = block.lines().filter(|l| l.starts_with("| `")).collect();
    assert_eq!(
        rows,
        [
            "| `polar-common` | `polar-common/` | pure | – | – |",
            "| `polar-ebpf` | `polar-ebpf/` | kernel | `polar-common` | – |",
            "| `polar-agent` | `polar-agent/` | agent | `polar-common`, `polar-ebpf` (build) | – |",
            "| `polar-tests` | `polar-tests/` | tests | `polar-agent` | – |",
            "| `xtask` | `xtask/` | tool | – | – |",
        ]
    );
    let doc = format!("# A\n\nintro\n\n{BEGIN}\nold\n{END}\n\n## B\n");
    let new = graph::replace_block(&doc, &block).unwrap();
    assert_eq!(
        new,
        format!("# A\n\nintro\n\n{BEGIN}\n{block}{END}\n\n## B\n")
    );
    assert_eq!(graph::replace_block(&new, &block).unwrap(), new);
    assert!(graph::replace_block("# A\n", &block).is_err());
    assert!(graph::replace_block(&format!("{END}\n{BEGIN}\n"), &block).is_err());
}
