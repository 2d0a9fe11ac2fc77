//! Session-level facts: status, group, policy versions, rewards.

use super::kit::{Convo, Render, Sim, Turn, meta};
use crate::{
    Builder, ChainRole, EndedBy, Label, RewardError, Rewards, SCHEMA_VERSION, SessionOutcome,
    Trajectory, TrajectoryStatus, apply_rewards, build, check,
};

fn two_chains() -> Sim {
    let mut sim = Sim::new(Render::default());
    let mut main = Convo::new("you are the main agent", "do it");
    let mut side = Convo::new("you name sessions", "name this session");
    main.step(&mut sim, Turn::new("", "call ls"));
    side.step(&mut sim, Turn::new("", "listing files"));
    main.tool("a");
    main.step(&mut sim, Turn::new("", "done"));
    sim
}

fn built(sim: &Sim, outcome: SessionOutcome) -> Trajectory {
    let meta = crate::SessionMeta {
        outcome,
        evaluation: Some(serde_json::json!({"tests_passed": 3})),
        ..meta()
    };
    let traj = build(&Builder::default(), &sim.records, &meta);
    assert_eq!(check(&traj, &sim.records), Ok(()));
    traj
}

#[test]
fn completed_session_metadata_and_outcome_reward() {
    let mut sim = two_chains();
    sim.records[2].backend.weight_version = Some("v2".into());
    let mut traj = built(&sim, SessionOutcome::Completed);
    assert_eq!(traj.schema_version, SCHEMA_VERSION);
    assert_eq!(
        (traj.status, traj.error.clone()),
        (TrajectoryStatus::Completed, None)
    );
    let md = &traj.metadata;
    assert_eq!(md.session_id, "s-1");
    assert_eq!(md.task_id.as_deref(), Some("task-1"));
    assert_eq!(
        md.group_id.as_deref(),
        Some("task-1"),
        "group defaults to the task"
    );
    assert_eq!(md.policy_versions, ["v1", "v2"]);
    assert_eq!(md.policy_version, None, "two versions: no single one");
    assert_eq!(md.evaluation, Some(serde_json::json!({"tests_passed": 3})));
    assert_eq!(traj.traces.len(), 2);
    assert_eq!(traj.traces[0].metadata.policy_versions, ["v1", "v2"]);
    assert_eq!(traj.traces[1].labels, [Label::SubAgent]);

    assert_eq!(apply_rewards(&mut traj, &Rewards::Outcome(1.0)), Ok(()));
    assert_eq!(traj.metadata.reward, Some(1.0));
    assert!(traj.traces.iter().all(|t| t.reward == Some(1.0)));

    assert_eq!(
        apply_rewards(&mut traj, &Rewards::PerTrace(vec![0.5, -1.0])),
        Ok(())
    );
    let rewards: Vec<_> = traj.traces.iter().map(|t| t.reward).collect();
    assert_eq!(rewards, [Some(0.5), Some(-1.0)]);

    // The outcome for the main chain, the sub-agent's own for its trace.
    let by_role = Rewards::ByRole {
        outcome: 1.0,
        roles: [(ChainRole::SubAgent, 0.25), (ChainRole::Side, 0.0)].into(),
    };
    assert_eq!(apply_rewards(&mut traj, &by_role), Ok(()));
    let rewards: Vec<_> = traj.traces.iter().map(|t| (t.role, t.reward)).collect();
    assert_eq!(
        rewards,
        [
            (ChainRole::Main, Some(1.0)),
            (ChainRole::SubAgent, Some(0.25))
        ]
    );
    assert_eq!(traj.metadata.reward, Some(1.0));
    // As the gateway writes it in session.json.
    assert_eq!(
        serde_json::to_value(&by_role).unwrap(),
        serde_json::json!({"kind": "by_role", "value": {"outcome": 1.0, "roles": {"sub_agent": 0.25, "side": 0.0}}})
    );
}

#[test]
fn bad_rewards_change_nothing() {
    let sim = two_chains();
    let mut traj = built(&sim, SessionOutcome::Completed);
    let before = traj.clone();
    assert_eq!(
        apply_rewards(&mut traj, &Rewards::PerTrace(vec![1.0])),
        Err(RewardError::CountMismatch {
            traces: 2,
            rewards: 1
        })
    );
    assert!(matches!(
        apply_rewards(&mut traj, &Rewards::Outcome(f64::NAN)),
        Err(RewardError::NotFinite { index: None, .. })
    ));
    assert!(matches!(
        apply_rewards(&mut traj, &Rewards::PerTrace(vec![0.0, f64::INFINITY])),
        Err(RewardError::NotFinite { index: Some(1), .. })
    ));
    let by_role = Rewards::ByRole {
        outcome: 1.0,
        roles: [(ChainRole::Side, f64::NAN)].into(),
    };
    assert!(matches!(
        apply_rewards(&mut traj, &by_role),
        Err(RewardError::NotFinite { index: None, .. })
    ));
    assert_eq!(traj, before);
}

#[test]
fn failed_sessions_keep_their_traces_flagged() {
    let sim = two_chains();
    for (outcome, status, error) in [
        (
            SessionOutcome::Timeout,
            TrajectoryStatus::Timeout,
            "the session ran out of time",
        ),
        (
            SessionOutcome::Error {
                message: "sandbox died".into(),
            },
            TrajectoryStatus::Error,
            "sandbox died",
        ),
    ] {
        let traj = built(&sim, outcome);
        assert_eq!(traj.status, status);
        assert_eq!(traj.error.as_deref(), Some(error));
        assert_eq!(traj.traces.len(), 2);
        assert!(
            traj.traces
                .iter()
                .all(|t| t.has_label(Label::SessionFailed))
        );
    }
}

#[test]
fn who_ended_the_session_is_labelled() {
    let sim = two_chains();
    let labels = |outcome: SessionOutcome, ended_by: Option<EndedBy>| {
        let meta = crate::SessionMeta {
            outcome,
            ended_by,
            ..meta()
        };
        let traj = build(&Builder::default(), &sim.records, &meta);
        assert_eq!(traj.metadata.ended_by, ended_by);
        (traj.status, traj.traces[0].labels.clone())
    };
    let error = || SessionOutcome::Error {
        message: "the backend failed".into(),
    };
    use Label::{EvaluatorFault, InfraFault, SessionFailed};
    for (outcome, ended_by, status, want) in [
        (
            SessionOutcome::Completed,
            None,
            TrajectoryStatus::Completed,
            vec![],
        ),
        (
            SessionOutcome::Completed,
            Some(EndedBy::Policy),
            TrajectoryStatus::Completed,
            vec![],
        ),
        (
            SessionOutcome::Timeout,
            Some(EndedBy::Budget),
            TrajectoryStatus::Timeout,
            vec![SessionFailed],
        ),
        (
            error(),
            Some(EndedBy::Backend),
            TrajectoryStatus::Error,
            vec![SessionFailed, InfraFault],
        ),
        (
            error(),
            Some(EndedBy::Polar),
            TrajectoryStatus::Error,
            vec![SessionFailed, InfraFault],
        ),
        (
            error(),
            Some(EndedBy::Evaluator),
            TrajectoryStatus::Error,
            vec![SessionFailed, EvaluatorFault],
        ),
        // A backend fault that ran the budget out: a timeout, not the policy's.
        (
            SessionOutcome::Timeout,
            Some(EndedBy::Backend),
            TrajectoryStatus::Timeout,
            vec![SessionFailed, InfraFault],
        ),
    ] {
        assert_eq!(labels(outcome, ended_by), (status, want), "{ended_by:?}");
    }
    let json = serde_json::to_value(labels_json(&sim)).unwrap_or_default();
    assert_eq!(json["metadata"]["ended_by"], "backend");
    assert_eq!(
        json["traces"][0]["labels"],
        serde_json::json!(["session_failed", "infra_fault"])
    );
}

fn labels_json(sim: &Sim) -> Trajectory {
    let meta = crate::SessionMeta {
        outcome: SessionOutcome::Error {
            message: "cut".into(),
        },
        ended_by: Some(EndedBy::Backend),
        ..meta()
    };
    build(&Builder::default(), &sim.records, &meta)
}

#[test]
fn trajectory_json_is_stable() {
    let sim = two_chains();
    let traj = built(&sim, SessionOutcome::Completed);
    let json = serde_json::to_value(&traj).unwrap_or_default();
    assert_eq!(json["schema_version"], SCHEMA_VERSION);
    assert_eq!(json["status"], "completed");
    assert_eq!(json["metadata"]["builder"]["kind"], "prefix_merging");
    assert_eq!(json["traces"][0]["segment_kind"]["kind"], "start");
    assert_eq!(json["traces"][0]["spans"][1]["join"]["kind"], "extend");
    assert_eq!(json["traces"][1]["labels"][0], "sub_agent");
    let back: Trajectory = serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back, traj);
    let builder: Builder = serde_json::from_str(
        r#"{"kind":"prefix_merging","template":{"end_of_turn":[2],"think":[3,4]}}"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(builder, Builder::PrefixMerging(o) if o.splice && o.template.is_some()));
}

/// Each call's span carries the version it ran under: the task's policy
/// version on its record (changed by a resume after a weight update) and
/// the backend's own weight version; the session's version stands in when
/// no record names one.
#[test]
fn spans_carry_each_calls_policy_and_weight_versions() {
    let mut sim = two_chains();
    // Main chain: c0 (w-42), c2 (w-43, after a weight update); side: c1.
    sim.records[0].policy_version = Some("w-42".into());
    sim.records[1].policy_version = Some("w-42".into());
    sim.records[2].policy_version = Some("w-43".into());
    sim.records[2].backend.weight_version = Some("v2".into());
    let traj = built(&sim, SessionOutcome::Completed);
    let main = &traj.traces[0];
    let versions: Vec<_> = main
        .spans
        .iter()
        .map(|s| (s.policy_version.as_deref(), s.weight_version.as_deref()))
        .collect();
    assert_eq!(
        versions,
        [(Some("w-42"), Some("v1")), (Some("w-43"), Some("v2"))]
    );
    assert_eq!(main.metadata.policy_versions, ["w-42", "w-43"]);
    assert_eq!(main.metadata.weight_versions, ["v1", "v2"]);
    assert_eq!(traj.traces[1].metadata.policy_versions, ["w-42"]);
    let md = &traj.metadata;
    assert_eq!(md.policy_versions, ["w-42", "w-43"]);
    assert_eq!(md.policy_version, None, "two versions: no single one");
    assert_eq!(md.weight_versions, ["v1", "v2"]);
    assert_eq!(md.weight_version, None);

    // A vLLM session (no weight version) whose task named one.
    let mut sim = two_chains();
    for r in &mut sim.records {
        r.backend.weight_version = None;
        r.policy_version = Some("w-42".into());
    }
    let traj = built(&sim, SessionOutcome::Completed);
    assert_eq!(traj.metadata.policy_version.as_deref(), Some("w-42"));
    assert_eq!(traj.metadata.weight_version, None);
    assert!(traj.metadata.weight_versions.is_empty());
    assert!(
        traj.traces
            .iter()
            .flat_map(|t| &t.spans)
            .all(|s| s.policy_version.as_deref() == Some("w-42") && s.weight_version.is_none())
    );

    // Records without versions (an older log): the session's own.
    let mut sim = two_chains();
    for r in &mut sim.records {
        r.backend.weight_version = None;
    }
    let meta = crate::SessionMeta {
        policy_version: Some("w-41".into()),
        ..meta()
    };
    let traj = build(&Builder::default(), &sim.records, &meta);
    assert_eq!(traj.metadata.policy_version.as_deref(), Some("w-41"));
    assert_eq!(traj.metadata.policy_versions, ["w-41"]);
}

/// One attempt, one trajectory: the attempt number goes to the metadata and
/// the count of earlier attempts set apart to the stats; a session recorded
/// outside the rollout path has neither, and trajectories written before
/// they existed read back without them.
#[test]
fn the_attempt_and_the_earlier_attempts_set_apart_are_recorded() {
    let sim = two_chains();
    let meta = crate::SessionMeta {
        attempt: Some(2),
        superseded_attempts: 1,
        ..meta()
    };
    let traj = build(&Builder::default(), &sim.records, &meta);
    assert_eq!(check(&traj, &sim.records), Ok(()));
    assert_eq!(traj.metadata.attempt, Some(2));
    assert_eq!(traj.stats.superseded_attempts, 1);
    let json = serde_json::to_value(&traj).unwrap_or_default();
    assert_eq!(json["metadata"]["attempt"], 2);
    assert_eq!(json["stats"]["superseded_attempts"], 1);

    let plain = built(&sim, SessionOutcome::Completed);
    assert_eq!(plain.metadata.attempt, None);
    assert_eq!(plain.stats.superseded_attempts, 0);
    let mut json = serde_json::to_value(&plain).unwrap_or_default();
    assert!(json["metadata"].get("attempt").is_none());
    if let Some(stats) = json["stats"].as_object_mut() {
        stats.remove("superseded_attempts");
    }
    let back: Trajectory = serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back, plain);
}

/// Calls whose reply went on after a backend fault are counted in the
/// stats, with either builder, and their traces are the usual ones.
#[test]
fn resumed_calls_are_counted() {
    let mut sim = two_chains();
    sim.records[0].resumed = Some(polar_record::Resumed {
        replicas: vec!["http://a".into(), "http://b".into()],
        part_tokens: vec![2, 3],
        weight_versions: vec!["1".into(), "2".into()],
        faults: vec!["cut".into()],
    });
    for builder in [Builder::default(), Builder::PerRequest] {
        let traj = build(&builder, &sim.records, &meta());
        assert_eq!(check(&traj, &sim.records), Ok(()));
        assert_eq!(traj.stats.resumed_calls, 1, "{builder:?}");
    }
    let traj = built(&two_chains(), SessionOutcome::Completed);
    assert_eq!(traj.stats.resumed_calls, 0);
}
