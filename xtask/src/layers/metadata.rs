//! What the layer check reads from `cargo metadata --format-version 1`: the
//! workspace members with their declared dependencies (`packages`), and the
//! resolved graph (`resolve.nodes`, features unified across the workspace).

use std::collections::HashMap;

use anyhow::{Context as _, Result, anyhow};
use serde_json::Value;

use super::Layer;

/// A dependency's kind, as declared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Normal,
    Build,
    Dev,
}

impl Kind {
    fn parse(kind: &Value) -> Result<Self> {
        match kind.as_str() {
            None if kind.is_null() => Ok(Self::Normal),
            Some("build") => Ok(Self::Build),
            Some("dev") => Ok(Self::Dev),
            _ => Err(anyhow!("unknown dependency kind {kind}")),
        }
    }
}

/// A dependency as a member's Cargo.toml declares it.
#[derive(Clone, Debug)]
pub struct Declared {
    /// The package name (not the name it is renamed to).
    pub name: String,
    pub kind: Kind,
}

/// A workspace member.
#[derive(Clone, Debug)]
pub struct Member {
    pub id: String,
    pub name: String,
    /// Its directory, relative to the workspace root.
    pub dir: String,
    pub deps: Vec<Declared>,
}

/// One edge of the resolved graph.
#[derive(Clone, Debug)]
pub struct Edge {
    /// The package id it leads to.
    pub to: String,
    /// Whether it is a normal and/or a build dependency (or only a dev one).
    pub normal: bool,
    pub build: bool,
}

/// The workspace as `cargo metadata` describes it.
#[derive(Clone, Debug)]
pub struct Workspace {
    pub members: Vec<Member>,
    /// Package id to package name, for every package.
    names: HashMap<String, String>,
    /// Package id to its resolved dependencies.
    edges: HashMap<String, Vec<Edge>>,
}

fn str_of<'a>(value: &'a Value, key: &str) -> Result<&'a str> {
    value[key]
        .as_str()
        .ok_or_else(|| anyhow!("cargo metadata: `{key}` is missing or not a string"))
}

fn array_of<'a>(value: &'a Value, key: &str) -> Result<&'a Vec<Value>> {
    value[key]
        .as_array()
        .ok_or_else(|| anyhow!("cargo metadata: `{key}` is missing or not an array"))
}

impl Workspace {
    /// Reads the output of `cargo metadata --format-version 1`.
    pub fn parse(json: &str) -> Result<Self> {
        let meta: Value =
            serde_json::from_str(json).context("cargo metadata printed something not JSON")?;
        let root = str_of(&meta, "workspace_root")?;
        let mut names = HashMap::new();
        let mut packages = HashMap::new();
        for package in array_of(&meta, "packages")? {
            let id = str_of(package, "id")?;
            names.insert(id.to_owned(), str_of(package, "name")?.to_owned());
            packages.insert(id, package);
        }
        let mut members = Vec::new();
        for id in array_of(&meta, "workspace_members")? {
            let id = id
                .as_str()
                .ok_or_else(|| anyhow!("cargo metadata: a workspace member id is not a string"))?;
            let package = packages
                .get(id)
                .ok_or_else(|| anyhow!("cargo metadata: no package for member {id}"))?;
            let manifest = str_of(package, "manifest_path")?;
            let dir = manifest
                .strip_suffix("Cargo.toml")
                .unwrap_or(manifest)
                .strip_prefix(root)
                .unwrap_or(manifest)
                .trim_matches('/');
            let mut deps = Vec::new();
            for dep in array_of(package, "dependencies")? {
                deps.push(Declared {
                    name: str_of(dep, "name")?.to_owned(),
                    kind: Kind::parse(&dep["kind"])?,
                });
            }
            members.push(Member {
                id: id.to_owned(),
                name: str_of(package, "name")?.to_owned(),
                dir: if dir.is_empty() {
                    ".".to_owned()
                } else {
                    format!("{dir}/")
                },
                deps,
            });
        }
        let resolve = meta
            .get("resolve")
            .filter(|r| !r.is_null())
            .ok_or_else(|| anyhow!("cargo metadata: no `resolve` (was --no-deps given?)"))?;
        let mut edges = HashMap::new();
        for node in array_of(resolve, "nodes")? {
            let mut out = Vec::new();
            for dep in array_of(node, "deps")? {
                let (mut normal, mut build) = (false, false);
                for kind in array_of(dep, "dep_kinds")? {
                    match Kind::parse(&kind["kind"])? {
                        Kind::Normal => normal = true,
                        Kind::Build => build = true,
                        Kind::Dev => {}
                    }
                }
                out.push(Edge {
                    to: str_of(dep, "pkg")?.to_owned(),
                    normal,
                    build,
                });
            }
            edges.insert(str_of(node, "id")?.to_owned(), out);
        }
        Ok(Self {
            members,
            names,
            edges,
        })
    }

    /// The name of the package `id` (the id itself if it is unknown).
    pub fn name<'a>(&'a self, id: &'a str) -> &'a str {
        self.names.get(id).map_or(id, String::as_str)
    }

    /// The resolved dependencies of the package `id`.
    pub fn edges(&self, id: &str) -> &[Edge] {
        self.edges.get(id).map_or(&[], Vec::as_slice)
    }

    /// The members in table order; members without a row last, by name.
    pub fn members_in_order(&self, table: &[Layer]) -> Vec<&Member> {
        let rank = |m: &Member| table.iter().position(|l| l.name == m.name);
        let mut members: Vec<&Member> = self.members.iter().collect();
        members.sort_by(|a, b| {
            let key = |m: &Member| (rank(m).unwrap_or(usize::MAX), m.name.clone());
            key(a).cmp(&key(b))
        });
        members
    }
}
