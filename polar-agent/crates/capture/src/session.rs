//! What the agent knows about a session besides its id: the task it belongs
//! to and free-form metadata. The sandbox runner (or `polar proxy`) fills
//! the [`SessionRegistry`] before the session's first call; the capture
//! stage reads it to stamp records and write `session.json`.

use std::collections::HashMap;
use std::sync::RwLock;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use polar_ids::SessionId;

/// A session's task and metadata.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionInfo {
    /// The task, when the session runs one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// Anything else worth keeping with the session (harness, sample index,
    /// group id, ...).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
}

/// The metadata key of the session's policy version.
pub const POLICY_VERSION_KEY: &str = "policy_version";
/// The metadata key of the task's instruction (a harness session's).
pub const INSTRUCTION_KEY: &str = "instruction";

impl SessionInfo {
    /// The policy version the session runs under
    /// (`metadata.policy_version`), stamped on each of its records.
    pub fn policy_version(&self) -> Option<&str> {
        self.metadata
            .get(POLICY_VERSION_KEY)
            .and_then(Value::as_str)
    }

    /// Sets the session's policy version.
    pub fn with_policy_version(mut self, version: Option<String>) -> Self {
        if let Some(v) = version {
            self.metadata.insert(POLICY_VERSION_KEY.into(), v.into());
        }
        self
    }

    /// Info naming only a task.
    pub fn task(task_id: impl Into<String>) -> Self {
        Self {
            task_id: Some(task_id.into()),
            metadata: Map::new(),
        }
    }
}

/// Sessions' info by id. Cheap to read from many tasks.
#[derive(Debug, Default)]
pub struct SessionRegistry {
    map: RwLock<HashMap<SessionId, SessionInfo>>,
}

impl SessionRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `session`'s info (replacing earlier info).
    pub fn register(&self, session: &SessionId, info: SessionInfo) {
        self.map
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(session.clone(), info);
    }

    /// A weight update finished: every registered session's calls from now
    /// on are stamped with policy `version`.
    pub fn set_policy_version(&self, version: &str) {
        let mut map = self
            .map
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for info in map.values_mut() {
            info.metadata
                .insert(POLICY_VERSION_KEY.into(), version.to_owned().into());
        }
    }

    /// Forgets `session`.
    pub fn unregister(&self, session: &SessionId) {
        self.map
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(session);
    }

    /// `session`'s info, when registered.
    pub fn get(&self, session: &SessionId) -> Option<SessionInfo> {
        self.map
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(session)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_get_unregister() {
        let r = SessionRegistry::new();
        let s: SessionId = "s-1".parse().unwrap();
        assert_eq!(r.get(&s), None);
        r.register(&s, SessionInfo::task("t-9"));
        assert_eq!(r.get(&s).unwrap().task_id.as_deref(), Some("t-9"));
        r.unregister(&s);
        assert_eq!(r.get(&s), None);
    }

    #[test]
    fn the_policy_version_lives_in_the_metadata() {
        let i = SessionInfo::task("t").with_policy_version(Some("w-42".into()));
        assert_eq!(i.policy_version(), Some("w-42"));
        assert_eq!(i.metadata["policy_version"], "w-42");
        assert_eq!(SessionInfo::task("t").policy_version(), None);
        assert_eq!(
            SessionInfo::task("t").with_policy_version(None),
            SessionInfo::task("t")
        );
    }

    #[test]
    fn a_weight_update_restamps_every_registered_session() {
        let r = SessionRegistry::new();
        let (a, b): (SessionId, SessionId) = ("s-a".parse().unwrap(), "s-b".parse().unwrap());
        r.register(
            &a,
            SessionInfo::task("t").with_policy_version(Some("w-42".into())),
        );
        r.register(&b, SessionInfo::task("t"));
        r.set_policy_version("w-43");
        for s in [&a, &b] {
            let info = r.get(s).unwrap();
            assert_eq!(info.policy_version(), Some("w-43"));
            assert_eq!(info.task_id.as_deref(), Some("t"));
        }
    }
}
