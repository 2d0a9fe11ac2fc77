//! Token-faithful chains measured with the real harness CLIs (root only;
//! `cargo bench -p polar-tests --bench chains --profile dev`, or with
//! arguments after `--`: families `qwen3`, `deepseek_v3_1`, `gptoss` and
//! harness names to run only those): every CLI of [`SIX`] on the four-step
//! task against `polar mock-backend --model-dir` serving Qwen3's real
//! files, server-rendered and token-faithful; DeepSeek-V3.1 and gpt-oss
//! with two CLIs each, both ways too. Prints (to stderr) one Markdown row
//! per session (BENCHMARKS.md, "Token-faithful chains") and, after the
//! table, what missed the token-faithful target. Needs `cargo build --bin
//! polar` (the dev profile's, which `--profile dev` runs), `cargo xtask
//! harnesses` and `cargo xtask chat-models` first.

use anyhow::Result;
use polar_tests::chains::{Family, Rendering, TABLE_HEAD, measure, table_row};
use polar_tests::harness::SIX;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let families: Vec<Family> = Family::ALL
        .into_iter()
        .filter(|f| args.iter().any(|a| a == f.dir_name()) || !args.iter().any(|a| is_family(a)))
        .collect();
    let chosen: Vec<&'static str> = SIX
        .into_iter()
        .filter(|h| args.iter().any(|a| a == h))
        .collect();
    let mut rows = Vec::new();
    let mut misses = Vec::new();
    for family in families {
        let harnesses: Vec<&'static str> = match (chosen.is_empty(), family) {
            (false, _) => chosen.clone(),
            (true, Family::Qwen3) => SIX.to_vec(),
            (true, _) => vec!["codex", "claude_code"],
        };
        for rendering in [Rendering::Server, Rendering::Faithful] {
            let started = std::time::Instant::now();
            for m in measure(&harnesses, family, rendering)? {
                let row = table_row(&m);
                eprintln!("{row}");
                rows.push(row);
                if rendering == Rendering::Faithful {
                    misses.extend(
                        m.faithful_misses()
                            .into_iter()
                            .map(|p| format!("{} ({family}): {p}", m.harness)),
                    );
                } else {
                    misses.extend(
                        m.problems
                            .iter()
                            .map(|p| format!("{} ({family}, server): {p}", m.harness)),
                    );
                }
            }
            eprintln!(
                "{family} {rendering}: {} harnesses in {:.0?}",
                harnesses.len(),
                started.elapsed()
            );
        }
    }
    eprintln!("{TABLE_HEAD}");
    for r in &rows {
        eprintln!("{r}");
    }
    if !misses.is_empty() {
        eprintln!("\nMissed:");
        for m in &misses {
            eprintln!("- {m}");
        }
    }
    Ok(())
}

fn is_family(arg: &str) -> bool {
    Family::ALL.iter().any(|f| f.dir_name() == arg)
}
