//! Plain-text reports for the CLI (pure): a task's progress line, its
//! final table of samples with its usable count and its failures grouped
//! by reason, and the server status summary.

use std::fmt::Write as _;

use polar_rollout_api::{ServerStatus, SessionState, TaskView};

/// `t1 running [####......] 4/10 finished: 4 done (3/10 usable), 2 running, 4 pending`.
pub fn progress_line(v: &TaskView) -> String {
    let c = &v.counts;
    let finished = c.done + c.failed + c.cancelled;
    let width = 20u32;
    let filled = (finished * width)
        .checked_div(v.num_samples)
        .unwrap_or(0)
        .min(width);
    let bar: String = (0..width)
        .map(|i| if i < filled { '#' } else { '.' })
        .collect();
    let mut line = format!(
        "{} {} [{bar}] {finished}/{} finished: {} done ({}/{} usable)",
        v.task_id,
        v.status.as_str(),
        v.num_samples,
        c.done,
        c.usable,
        v.requested
    );
    for (n, what) in [
        (c.running, "running"),
        (c.dispatched, "dispatched"),
        (c.pending, "pending"),
        (c.failed, "failed"),
        (c.cancelled, "cancelled"),
    ] {
        if n > 0 {
            let _ = write!(line, ", {n} {what}");
        }
    }
    line
}

/// The table of a finished task: one row per sample.
pub fn results_table(v: &TaskView) -> String {
    let mut rows: Vec<[String; 7]> = vec![[
        "sample".into(),
        "status".into(),
        "reward".into(),
        "prompt_tok_all_calls".into(),
        "response_tok_all_calls".into(),
        "node".into(),
        "trajectory / note".into(),
    ]];
    for s in &v.samples {
        let row = match &s.state {
            SessionState::Done { node, result, .. } => [
                s.sample_index.to_string(),
                result.status.as_str().to_owned(),
                result
                    .reward
                    .map_or_else(|| "-".to_owned(), |r| format!("{r:.4}")),
                result.tokens.prompt.to_string(),
                result.tokens.response.to_string(),
                node.clone(),
                result
                    .trajectory_uri
                    .clone()
                    .or_else(|| result.error.clone())
                    .unwrap_or_else(|| "-".into()),
            ],
            SessionState::Failed { error } => row_without_result(s.sample_index, "failed", error),
            SessionState::Cancelled { reason } => {
                row_without_result(s.sample_index, "cancelled", reason)
            }
            other => row_without_result(s.sample_index, other.kind().as_str(), ""),
        };
        rows.push(row);
    }
    let mut widths = [0usize; 7];
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = format!(
        "task {} ({}), group {}{}\n",
        v.task_id,
        v.status.as_str(),
        v.group_id,
        v.reason
            .as_deref()
            .map(|r| format!(", {r}"))
            .unwrap_or_default()
    );
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (cell, w))| {
                if i == 6 {
                    cell.clone()
                } else {
                    format!("{cell:<w$}")
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "(token counts are summed over each session's model calls: every call's whole prompt counts, so they exceed a trace's own prompt and response)"
    );
    let _ = writeln!(
        out,
        "{} of {} requested samples usable{}",
        v.counts.usable,
        v.requested,
        v.mean_reward
            .map(|m| format!(", mean reward {m:.4} over the usable ones"))
            .unwrap_or_default()
    );
    out.push_str(&failures_text(v));
    out
}

/// The task's failures, grouped: `3 samples error: ... (samples 0, 2, 5)`.
pub fn failures_text(v: &TaskView) -> String {
    let mut out = String::new();
    if v.failures.is_empty() {
        return out;
    }
    let _ = writeln!(out, "unusable samples, by reason:");
    for g in &v.failures {
        let mut indexes: Vec<String> = g.samples.iter().take(10).map(u32::to_string).collect();
        if g.samples.len() > 10 {
            indexes.push(format!("... {} more", g.samples.len() - 10));
        }
        let _ = writeln!(
            out,
            "  {} {} {}: {} (sample{} {})",
            g.count,
            if g.count == 1 { "sample" } else { "samples" },
            g.status,
            g.error,
            if g.samples.len() == 1 { "" } else { "s" },
            indexes.join(", ")
        );
    }
    out
}

fn row_without_result(index: u32, status: &str, note: &str) -> [String; 7] {
    [
        index.to_string(),
        status.to_owned(),
        "-".into(),
        "-".into(),
        "-".into(),
        "-".into(),
        if note.is_empty() {
            "-".into()
        } else {
            note.to_owned()
        },
    ]
}

/// `polar status`: server, nodes, tasks.
pub fn status_text(s: &ServerStatus, url: &str) -> String {
    let mut out = format!(
        "rollout server {url}: up {}s, version {}\n",
        s.uptime_secs, s.server_version
    );
    let join = |m: &std::collections::BTreeMap<String, u64>| {
        m.iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(out, "tasks: {}", join(&s.tasks));
    let _ = writeln!(out, "sessions: {}", join(&s.sessions));
    let _ = writeln!(out, "nodes: {}", s.nodes.len());
    for n in &s.nodes {
        let _ = writeln!(
            out,
            "  {} {} {} assigned {}/{} (load {:.2}), heartbeat {} ms ago",
            n.node_id,
            n.address,
            n.health.as_str(),
            n.assigned,
            n.capacity.max_sessions,
            n.load,
            n.last_heartbeat_ms_ago
        );
        if !n.backends.is_empty() {
            let backends: Vec<String> = n
                .backends
                .iter()
                .map(|(name, b)| {
                    format!(
                        "{name} {}/{} replicas healthy{}",
                        b.healthy,
                        b.replicas,
                        if b.is_up() { "" } else { " (DOWN)" }
                    )
                })
                .collect();
            let _ = writeln!(out, "    backends: {}", backends.join(", "));
        }
    }
    out
}
