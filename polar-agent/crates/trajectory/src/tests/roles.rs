//! Chain roles: `main`, `sub_agent`, `side`, decided by what the calls are
//! (tools offered, structured output, the task's instruction), whatever
//! order they come in.

use super::kit::{Convo, Render, Sim, Turn, meta, tok};
use crate::{Builder, ChainRole, Label, SessionMeta, Trajectory, build, check};
use polar_chat::{ResponseFormat, Tool};

fn bash() -> Tool {
    Tool {
        name: "bash".into(),
        description: None,
        parameters: polar_json::RawJson::from_value(&serde_json::json!({"type": "object"})),
    }
}

/// The instruction as the kit writes user messages (token ids as text).
fn instruction(task: &str) -> String {
    tok(task)
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

fn offer_tools(sim: &mut Sim, calls: &[usize]) {
    for &i in calls {
        sim.records[i].request.tools = vec![bash()];
    }
}

/// An opencode-like session: a title call first (structured output, no
/// tools), then the main agent (tools, the task), a sub-agent (tools, its
/// own task) with more calls than the main one, and a summary (no tools).
fn session() -> (Sim, [usize; 4]) {
    let mut sim = Sim::new(Render::default());
    let mut title = Convo::new("you write titles", "fix the failing test");
    let mut main = Convo::new("you are the agent", "fix the failing test");
    let mut sub = Convo::new("you explore code", "find the test file");
    let mut summary = Convo::new("you summarize", "summarize the work");
    let t0 = title.step(&mut sim, Turn::new("", "test fix"));
    sim.records[t0].request.response_format = Some(ResponseFormat::JsonObject);
    let m0 = main.step(&mut sim, Turn::new("", "call task"));
    let s0 = sub.step(&mut sim, Turn::new("", "call ls"));
    sub.tool("a b");
    let s1 = sub.step(&mut sim, Turn::new("", "call cat"));
    sub.tool("c d");
    let s2 = sub.step(&mut sim, Turn::new("", "found it"));
    main.tool("found it");
    let m1 = main.step(&mut sim, Turn::new("", "done"));
    let y0 = summary.step(&mut sim, Turn::new("", "fixed the test"));
    offer_tools(&mut sim, &[m0, m1, s0, s1, s2]);
    (sim, [t0, m0, s0, y0])
}

fn roles(traj: &Trajectory) -> Vec<(String, ChainRole)> {
    traj.traces
        .iter()
        .map(|t| (t.call_ids[0].clone(), t.role))
        .collect()
}

fn with_instruction(task: &str) -> SessionMeta {
    SessionMeta {
        instruction: Some(instruction(task)),
        ..meta()
    }
}

#[test]
fn the_main_chain_carries_the_task_and_side_calls_are_side() {
    let (sim, [t0, m0, s0, y0]) = session();
    let c = |i: usize| format!("c{i}");
    let meta = with_instruction("fix the failing test");
    let traj = build(&Builder::default(), &sim.records, &meta);
    assert_eq!(check(&traj, &sim.records), Ok(()));
    let mut got = roles(&traj);
    got.sort();
    let mut want = vec![
        (c(t0), ChainRole::Side),
        (c(m0), ChainRole::Main),
        (c(s0), ChainRole::SubAgent),
        (c(y0), ChainRole::Side),
    ];
    want.sort();
    assert_eq!(got, want);
    // The title call came first: chain 0 is not the main agent's.
    assert_eq!(traj.traces[0].role, ChainRole::Side);
    let main: Vec<_> = traj
        .traces
        .iter()
        .filter(|t| t.role == ChainRole::Main)
        .collect();
    assert_eq!(main.len(), 1);
    assert_eq!(main[0].call_ids.len(), 2, "both main calls merged");
    assert!(main[0].labels.is_empty(), "{:?}", main[0].labels);
    for t in &traj.traces {
        match t.role {
            ChainRole::Main => {}
            ChainRole::SubAgent => assert!(t.has_label(Label::SubAgent)),
            ChainRole::Side => {
                assert!(t.has_label(Label::Side) && !t.has_label(Label::SubAgent));
            }
        }
    }
}

#[test]
fn without_the_instruction_the_busiest_tool_chain_is_main() {
    let (sim, [_, m0, s0, _]) = session();
    let traj = build(&Builder::default(), &sim.records, &meta());
    let role_of = |i: usize| {
        traj.traces
            .iter()
            .find(|t| t.call_ids[0] == format!("c{i}"))
            .map(|t| t.role)
    };
    // The sub-agent made more calls: without the task to go by, it wins.
    assert_eq!(role_of(s0), Some(ChainRole::Main));
    assert_eq!(role_of(m0), Some(ChainRole::SubAgent));
}

#[test]
fn per_request_traces_get_their_conversations_roles() {
    let (sim, [t0, m0, s0, y0]) = session();
    let meta = with_instruction("fix the failing test");
    let traj = build(&Builder::PerRequest, &sim.records, &meta);
    assert_eq!(check(&traj, &sim.records), Ok(()));
    let got: Vec<(String, ChainRole)> = roles(&traj);
    let role = |i: usize| got.iter().find(|(c, _)| *c == format!("c{i}")).map(|x| x.1);
    assert_eq!(role(t0), Some(ChainRole::Side));
    assert_eq!(role(y0), Some(ChainRole::Side));
    assert_eq!(role(s0), Some(ChainRole::SubAgent));
    assert_eq!(role(m0), Some(ChainRole::Main));
    // Every call of the main conversation is main, the second one too.
    let mains = got.iter().filter(|(_, r)| *r == ChainRole::Main).count();
    assert_eq!(mains, 2);
}

#[test]
fn sessions_without_tools_keep_one_main_chain_and_sub_agents() {
    let mut sim = Sim::new(Render::default());
    let mut a = Convo::new("main", "do it");
    let mut b = Convo::new("helper", "help");
    a.step(&mut sim, Turn::new("", "x"));
    a.tool("y");
    a.step(&mut sim, Turn::new("", "z"));
    b.step(&mut sim, Turn::new("", "w"));
    let traj = build(&Builder::default(), &sim.records, &meta());
    let roles: Vec<ChainRole> = traj.traces.iter().map(|t| t.role).collect();
    assert_eq!(roles, [ChainRole::Main, ChainRole::SubAgent]);
}

#[test]
fn an_instruction_is_recognized_when_a_harness_wraps_or_rewrites_it() {
    use crate::roles::{Instruction, mentions};
    let task = Instruction::new(
        "Create the file notes.txt with the line 'polar 1', then make the check pass.",
    );
    // Whole, once whitespace is collapsed: wrapped in tags, re-flowed.
    assert!(mentions(
        "<user_query>\n  Create the file notes.txt with the line 'polar 1',\n  then make the check pass.\n</user_query>",
        &task
    ));
    // Rewritten lightly: quotes escaped, case and punctuation changed.
    assert!(mentions(
        "Task: create the file `notes.txt` with the line \\\"polar 1\\\" - then make the check pass!",
        &task
    ));
    // Another task sharing a few words is not this one.
    assert!(!mentions(
        "Create the file report.md listing what the check found.",
        &task
    ));
    assert!(!mentions("", &task));
    // A short instruction must appear whole.
    let short = Instruction::new("fix it");
    assert!(mentions("please   fix   it now", &short));
    assert!(!mentions("fix the other thing", &short));
}

#[test]
fn the_main_chain_is_found_when_the_harness_wraps_the_task() {
    let (mut sim, [_, m0, s0, _]) = session();
    // The main agent's first user message wraps and re-flows the task.
    let task = "fix the failing test in the parser module";
    let wrapped = format!(
        "<task>\n{}\n</task>",
        instruction(task).replace(' ', "\n  ")
    );
    sim.records[m0].request.messages[1] =
        polar_chat::Message::text(polar_chat::Role::User, wrapped);
    let traj = build(&Builder::default(), &sim.records, &with_instruction(task));
    let role_of = |i: usize| {
        traj.traces
            .iter()
            .find(|t| t.call_ids.contains(&format!("c{i}")))
            .map(|t| t.role)
    };
    assert_eq!(role_of(m0), Some(ChainRole::Main));
    assert_eq!(role_of(s0), Some(ChainRole::SubAgent));
}

/// A Gemini-CLI-like session: after a main call, a structured check asked
/// with the main conversation (who speaks next?), then the main agent goes
/// on from before the check; after its last call, another check.
fn side_check_session() -> (Sim, [usize; 5]) {
    let mut sim = Sim::new(Render::default());
    let mut main = Convo::new("you are the agent", "fix the failing test");
    let ask = |sim: &mut Sim, main: &Convo| {
        let mut check = main.clone();
        check
            .msgs
            .push(super::kit::Msg::User(tok("who speaks next")));
        let k = check.step(sim, Turn::new("", "model"));
        sim.records[k].request.response_format = Some(ResponseFormat::JsonObject);
        k
    };
    let m0 = main.step(&mut sim, Turn::new("", "call ls"));
    main.tool("a b");
    let k0 = ask(&mut sim, &main);
    let m1 = main.step(&mut sim, Turn::new("", "call cat"));
    main.tool("c d");
    let m2 = main.step(&mut sim, Turn::new("", "done"));
    let k1 = ask(&mut sim, &main);
    offer_tools(&mut sim, &[m0, m1, m2, k0, k1]);
    (sim, [m0, m1, m2, k0, k1])
}

#[test]
fn a_structured_check_asked_with_the_main_conversation_leaves_it_main() {
    let (sim, [m0, m1, m2, k0, k1]) = side_check_session();
    let meta = with_instruction("fix the failing test");
    for builder in [Builder::default(), Builder::PerRequest] {
        let traj = build(&builder, &sim.records, &meta);
        assert_eq!(check(&traj, &sim.records), Ok(()));
        let trace_of = |i: usize| {
            traj.traces
                .iter()
                .find(|t| t.call_ids.contains(&format!("c{i}")))
                .unwrap()
        };
        for m in [m0, m1, m2] {
            assert_eq!(trace_of(m).role, ChainRole::Main, "{builder:?} c{m}");
        }
        for k in [k0, k1] {
            let t = trace_of(k);
            assert_eq!(t.call_ids, vec![format!("c{k}")], "{builder:?}");
            assert_eq!(t.role, ChainRole::Side, "{builder:?} c{k}");
            assert!(!t.has_label(Label::SupersededRetry), "{builder:?} c{k}");
        }
    }
    // Merged, the main agent's calls are one trace.
    let traj = build(&Builder::default(), &sim.records, &meta);
    assert_eq!(
        traj.traces[0].call_ids,
        [m0, m1, m2].map(|i| format!("c{i}"))
    );
}

#[test]
fn a_structured_turn_the_conversation_goes_on_from_is_one_of_its_calls() {
    let mut sim = Sim::new(Render::default());
    let mut main = Convo::new("you are the agent", "fix the failing test");
    let m0 = main.step(&mut sim, Turn::new("", "call ls"));
    main.tool("a b");
    let m1 = main.step(&mut sim, Turn::new("", "report json"));
    sim.records[m1].request.response_format = Some(ResponseFormat::JsonObject);
    main.tool("c d");
    let m2 = main.step(&mut sim, Turn::new("", "done"));
    offer_tools(&mut sim, &[m0, m1, m2]);
    let traj = build(
        &Builder::default(),
        &sim.records,
        &with_instruction("fix the failing test"),
    );
    assert_eq!(check(&traj, &sim.records), Ok(()));
    assert_eq!(traj.traces.len(), 1, "{:?}", traj.traces);
    assert_eq!(traj.traces[0].role, ChainRole::Main);
    assert_eq!(
        traj.traces[0].call_ids,
        [m0, m1, m2].map(|i| format!("c{i}"))
    );
    assert!(
        traj.traces[0].labels.is_empty(),
        "{:?}",
        traj.traces[0].labels
    );
}
