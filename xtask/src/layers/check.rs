//! The layer rules applied to a workspace: see the list in the parent
//! module's documentation.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt;

use super::metadata::{Edge, Kind, Member, Workspace};
use super::{Allowed, Class, EBPF_SIDE, IO_CRATES, IO_CRATES_DIRECT, Layer, OWNED, STABLE_ONLY};

/// Which rule a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// A workspace member without a row.
    Undeclared,
    /// A workspace dependency the row does not list.
    NotInRow,
    /// A build-only workspace crate used as a normal dependency.
    BuildOnly,
    /// A `pure` crate reaching an I/O crate.
    PureIo,
    /// An owned external crate used by a crate that does not own it.
    Owned,
    /// A stable-only crate reaching the eBPF side.
    StableOnly,
    /// A crate other than the tests depending on the agent crate.
    AgentDependent,
    /// A cycle among workspace crates.
    Cycle,
}

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The crate whose dependencies break the rule.
    pub krate: String,
    /// The dependency (for a cycle, the crate it comes back to).
    pub dependency: String,
    pub rule: Rule,
    /// The rule, and how the dependency comes in.
    pub detail: String,
}

impl Rule {
    /// A short name, printed with each violation.
    pub fn id(self) -> &'static str {
        match self {
            Self::Undeclared => "every-crate-has-a-row",
            Self::NotInRow => "row-allows-dependency",
            Self::BuildOnly => "build-dependency-only",
            Self::PureIo => "pure-uses-no-io",
            Self::Owned => "owned-dependency",
            Self::StableOnly => "builds-without-ebpf",
            Self::AgentDependent => "only-tests-use-agent",
            Self::Cycle => "no-cycles",
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.dependency.is_empty() {
            write!(f, "{} [{}]: {}", self.krate, self.rule.id(), self.detail)
        } else {
            write!(
                f,
                "{} -> {} [{}]: {}",
                self.krate,
                self.dependency,
                self.rule.id(),
                self.detail
            )
        }
    }
}

/// Every rule `ws` breaks, crate by crate in table order.
pub fn check(ws: &Workspace, table: &[Layer]) -> Vec<Violation> {
    let rows: HashMap<&str, (usize, &Layer)> = table
        .iter()
        .enumerate()
        .map(|(i, l)| (l.name, (i, l)))
        .collect();
    let members: HashSet<&str> = ws.members.iter().map(|m| m.name.as_str()).collect();
    let mut out = Vec::new();
    for member in ws.members_in_order(table) {
        let Some(&(index, layer)) = rows.get(member.name.as_str()) else {
            out.push(Violation {
                krate: member.name.clone(),
                dependency: String::new(),
                rule: Rule::Undeclared,
                detail: format!(
                    "{} ({}) is a workspace member without a row in the layer table; \
                     add one to LAYERS in xtask/src/layers.rs",
                    member.name, member.dir
                ),
            });
            continue;
        };
        workspace_deps(member, index, layer, table, &rows, &members, &mut out);
        owned_deps(member, layer, &members, &mut out);
        if layer.class == Class::Pure {
            pure_deps(ws, member, &rows, &mut out);
        }
        if STABLE_ONLY.contains(&layer.name) {
            let found = reach(ws, &member.id, |e| e.normal || e.build, &rows);
            for (name, path) in found {
                if EBPF_SIDE.contains(&name.as_str()) {
                    out.push(Violation {
                        krate: member.name.clone(),
                        dependency: name,
                        rule: Rule::StableOnly,
                        detail: format!(
                            "{} must build without nightly, bpf-linker or LLVM, so must not \
                             depend on {}, even indirectly; it does through {path}",
                            member.name,
                            EBPF_SIDE.join(", ")
                        ),
                    });
                }
            }
        }
    }
    cycles(ws, &mut out);
    out
}

/// The row rule, the build-only rule and the agent-dependents rule, for each
/// declared normal or build dependency on a workspace crate.
fn workspace_deps(
    member: &Member,
    index: usize,
    layer: &Layer,
    table: &[Layer],
    rows: &HashMap<&str, (usize, &Layer)>,
    members: &HashSet<&str>,
    out: &mut Vec<Violation>,
) {
    let mut seen = HashSet::new();
    for dep in member.deps.iter().filter(|d| d.kind != Kind::Dev) {
        let name = dep.name.as_str();
        if !members.contains(name) || !seen.insert((name, dep.kind)) {
            continue;
        }
        let violation = |rule, detail| Violation {
            krate: member.name.clone(),
            dependency: name.to_owned(),
            rule,
            detail,
        };
        let target = rows.get(name);
        if let Some((_, t)) = target
            && t.class == Class::Agent
            && layer.class != Class::Tests
        {
            out.push(violation(
                Rule::AgentDependent,
                format!(
                    "only the tests crate may depend on {name} (class agent); move what \
                     {} needs out of it into a crate of its own",
                    member.name
                ),
            ));
            continue;
        }
        if layer.build_only.contains(&name) {
            if dep.kind != Kind::Build {
                out.push(violation(
                    Rule::BuildOnly,
                    format!(
                        "{} may use {name} as a build-dependency only, and has it as a \
                         normal one",
                        member.name
                    ),
                ));
            }
            continue;
        }
        let list = match layer.may_use {
            Allowed::Any => continue,
            Allowed::Only(list) if list.contains(&name) => continue,
            Allowed::Above if target.is_some_and(|&(i, _)| i < index) => continue,
            Allowed::Only([]) => "no workspace crate".to_owned(),
            Allowed::Only(list) => list.join(", "),
            Allowed::Above => format!(
                "the crates above it in the table ({})",
                table[..index]
                    .iter()
                    .map(|l| l.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        out.push(violation(
            Rule::NotInRow,
            format!(
                "{} ({}) may depend on {list}, not on {name} ({}); change the code, or \
                 its row in LAYERS (xtask/src/layers.rs) if the layering should change",
                member.name,
                layer.class.name(),
                target.map_or("no row", |(_, t)| t.class.name()),
            ),
        ));
    }
}

/// The owned-dependency rule. While none of a dependency's owners is a
/// workspace member yet, its code still lives in the agent crate, which may
/// then keep the dependency. A row's `io_allowed` crates are exempt.
fn owned_deps(member: &Member, layer: &Layer, members: &HashSet<&str>, out: &mut Vec<Violation>) {
    let mut seen = HashSet::new();
    for dep in member.deps.iter().filter(|d| d.kind != Kind::Dev) {
        let name = dep.name.as_str();
        let Some(owned) = OWNED
            .iter()
            .find(|o| o.deps.iter().any(|p| pattern_matches(p, name)))
        else {
            continue;
        };
        if owned.owners.contains(&member.name.as_str())
            || layer.io_allowed.contains(&name)
            || !seen.insert(name)
        {
            continue;
        }
        let owners_exist = owned.owners.iter().any(|o| members.contains(o));
        if !owners_exist && layer.class == Class::Agent {
            continue;
        }
        out.push(Violation {
            krate: member.name.clone(),
            dependency: name.to_owned(),
            rule: Rule::Owned,
            detail: format!(
                "only {} may depend directly on {} ({})",
                owned.owners.join(" and "),
                owned.deps.join(", "),
                owned.why
            ),
        });
    }
}

fn pattern_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// The pure rule: no I/O crate among the normal dependencies, transitively.
fn pure_deps(
    ws: &Workspace,
    member: &Member,
    rows: &HashMap<&str, (usize, &Layer)>,
    out: &mut Vec<Violation>,
) {
    let rule = format!(
        "{} is pure: no I/O crate (IO_CRATES in xtask/src/layers.rs) among its normal \
         dependencies, even indirectly",
        member.name
    );
    let exempt = rows
        .get(member.name.as_str())
        .map_or(&[][..], |(_, l)| l.io_allowed);
    let mut direct = BTreeSet::new();
    for dep in member.deps.iter().filter(|d| d.kind == Kind::Normal) {
        if IO_CRATES_DIRECT.contains(&dep.name.as_str()) && !exempt.contains(&dep.name.as_str()) {
            direct.insert(dep.name.clone());
        }
    }
    for name in direct {
        out.push(Violation {
            krate: member.name.clone(),
            dependency: name,
            rule: Rule::PureIo,
            detail: format!("{rule}; it is a direct dependency"),
        });
    }
    for (name, path) in reach(ws, &member.id, |e| e.normal, rows) {
        if IO_CRATES.contains(&name.as_str()) {
            out.push(Violation {
                krate: member.name.clone(),
                dependency: name,
                rule: Rule::PureIo,
                detail: format!("{rule}; it comes in through {path}"),
            });
        }
    }
}

/// Every package reached from `start` by the edges `follow` accepts (minus
/// the edges the rows exempt), with the shortest chain of names to it, in
/// breadth-first order.
fn reach(
    ws: &Workspace,
    start: &str,
    follow: impl Fn(&Edge) -> bool,
    rows: &HashMap<&str, (usize, &Layer)>,
) -> Vec<(String, String)> {
    let mut parent: HashMap<&str, &str> = HashMap::new();
    let mut queue = VecDeque::from([start]);
    let mut order = Vec::new();
    while let Some(id) = queue.pop_front() {
        let from = ws.name(id);
        let exempt = rows.get(from).map_or(&[][..], |(_, l)| l.io_allowed);
        for edge in ws.edges(id) {
            let to = edge.to.as_str();
            if !follow(edge) || to == start || parent.contains_key(to) {
                continue;
            }
            if exempt.contains(&ws.name(to)) {
                continue;
            }
            parent.insert(to, id);
            order.push(to);
            queue.push_back(to);
        }
    }
    order
        .into_iter()
        .map(|id| {
            let mut chain = vec![ws.name(id)];
            let mut at = id;
            while let Some(&p) = parent.get(at) {
                chain.push(ws.name(p));
                at = p;
            }
            chain.reverse();
            (ws.name(id).to_owned(), chain.join(" -> "))
        })
        .collect()
}

/// Cycles among workspace crates over declared dependencies of every kind,
/// one violation per cycle (as a set of crates).
fn cycles(ws: &Workspace, out: &mut Vec<Violation>) {
    /// A crate on the depth-first path: the kind of the edge that led to it,
    /// and its edges still to follow (the next one last).
    struct Frame<'a> {
        name: &'a str,
        kind: Kind,
        pending: Vec<(&'a str, Kind)>,
    }
    let names: Vec<&str> = ws.members.iter().map(|m| m.name.as_str()).collect();
    let frame = |name, kind| {
        let pending = ws
            .members
            .iter()
            .find(|m| m.name == name)
            .map(|m| {
                m.deps
                    .iter()
                    .rev()
                    .filter(|d| names.contains(&d.name.as_str()))
                    .map(|d| (d.name.as_str(), d.kind))
                    .collect()
            })
            .unwrap_or_default();
        Frame {
            name,
            kind,
            pending,
        }
    };
    let mut reported: HashSet<BTreeSet<&str>> = HashSet::new();
    let mut done: HashSet<&str> = HashSet::new();
    for &start in &names {
        let mut stack = vec![frame(start, Kind::Normal)];
        while let Some(top) = stack.last_mut() {
            let Some((next, kind)) = top.pending.pop() else {
                if let Some(f) = stack.pop() {
                    done.insert(f.name);
                }
                continue;
            };
            if let Some(from) = stack.iter().position(|f| f.name == next) {
                let mut chain = vec![next.to_owned()];
                chain.extend(
                    stack[from + 1..]
                        .iter()
                        .map(|f| format!("{}{}", f.name, kind_note(f.kind))),
                );
                chain.push(format!("{next}{}", kind_note(kind)));
                let set: BTreeSet<&str> = stack[from..].iter().map(|f| f.name).collect();
                if reported.insert(set) {
                    out.push(Violation {
                        krate: stack.last().map_or(next, |f| f.name).to_owned(),
                        dependency: next.to_owned(),
                        rule: Rule::Cycle,
                        detail: format!(
                            "workspace crates depend on one another in a cycle, \
                             dev-dependencies included: {}",
                            chain.join(" -> ")
                        ),
                    });
                }
            } else if !done.contains(next) {
                stack.push(frame(next, kind));
            }
        }
    }
}

fn kind_note(kind: Kind) -> &'static str {
    match kind {
        Kind::Normal => "",
        Kind::Build => " (build)",
        Kind::Dev => " (dev)",
    }
}
