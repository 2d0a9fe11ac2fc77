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

impl SessionInfo {
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
}
