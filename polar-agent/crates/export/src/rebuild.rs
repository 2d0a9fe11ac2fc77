//! A session's records to a checked trajectory, ready to export: build with
//! the chosen builder, apply the recorded rewards, verify the invariants.
//! Pure (no I/O): the interface `polar export` and the agent's post-run
//! stage share, whatever reads the records.

use polar_record::CompletionRecord;
use polar_trajectory::{Builder, Rewards, SessionMeta, Trajectory, apply_rewards, build, check};

use super::error::ExportError;

/// Builds, rewards and checks the trajectory of one session.
pub fn rebuild(
    builder: &Builder,
    records: &[CompletionRecord],
    meta: &SessionMeta,
    rewards: Option<&Rewards>,
) -> Result<Trajectory, ExportError> {
    let mut traj = build(builder, records, meta);
    if let Some(r) = rewards {
        apply_rewards(&mut traj, r).map_err(|source| ExportError::Reward {
            session: meta.session_id.clone(),
            source,
        })?;
    }
    check(&traj, records).map_err(|source| ExportError::Invariant {
        session: meta.session_id.clone(),
        source,
    })?;
    Ok(traj)
}
