//! [`LiveRules`]: the routing rules in force, shared by the proxy, the
//! base-URL listener and the DNS responder, and replaced as one on a reload.
//! Readers take a snapshot (`current`) once per connection or request, so a
//! connection in flight keeps the decision it was given.

use std::sync::{Arc, PoisonError, RwLock};

use super::Rules;

/// The routing rules in force; clones share them.
#[derive(Debug, Clone)]
pub struct LiveRules(Arc<RwLock<Arc<Rules>>>);

impl LiveRules {
    /// Rules in force from now on.
    pub fn new(rules: Rules) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(rules))))
    }

    /// A snapshot of the rules in force.
    pub fn current(&self) -> Arc<Rules> {
        Arc::clone(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Puts `rules` in force for every holder at once; returns the old ones.
    pub fn replace(&self, rules: Rules) -> Arc<Rules> {
        let mut slot = self.0.write().unwrap_or_else(PoisonError::into_inner);
        std::mem::replace(&mut *slot, Arc::new(rules))
    }
}

impl From<Arc<Rules>> for LiveRules {
    fn from(rules: Arc<Rules>) -> Self {
        Self(Arc::new(RwLock::new(rules)))
    }
}

impl From<Rules> for LiveRules {
    fn from(rules: Rules) -> Self {
        Self::new(rules)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DefaultAction;

    #[test]
    fn clones_see_a_replacement_and_old_snapshots_stay() {
        let a = LiveRules::new(Rules::new(Vec::new(), DefaultAction::Deny));
        let b = a.clone();
        let before = b.current();
        let old = a.replace(Rules::new(Vec::new(), DefaultAction::Pass));
        assert_eq!(old.default_action(), DefaultAction::Deny);
        assert_eq!(before.default_action(), DefaultAction::Deny);
        assert_eq!(b.current().default_action(), DefaultAction::Pass);
    }
}
