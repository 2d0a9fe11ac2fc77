//! The node's range of sandbox uids (`sandbox.uid_first`, `sandbox.uid_count`):
//! its value and its checks without I/O. The agent's sandbox leases one uid
//! of it per session and checks it against the node's users at start.

/// The node's sandbox uids: `first..first + count` (gids the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UidRange {
    /// The first uid.
    pub first: u32,
    /// How many.
    pub count: u32,
}

impl Default for UidRange {
    fn default() -> Self {
        Self {
            first: DEFAULT_FIRST,
            count: DEFAULT_COUNT,
        }
    }
}

/// `sandbox.uid_first`'s default: far above any distribution's users and
/// the subordinate ranges rootless containers take (`/etc/subuid`), below
/// 2^31 (some programs keep uids in signed 32 bits).
pub const DEFAULT_FIRST: u32 = 1_500_000_000;
/// `sandbox.uid_count`'s default.
pub const DEFAULT_COUNT: u32 = 65_536;
/// The highest uid a range may reach.
pub const MAX_UID: u32 = (1 << 31) - 2;

/// Ids a range may never hold: root and the overflow ids (`nobody`).
const RESERVED: [u32; 3] = [0, 65534, 65535];

impl UidRange {
    /// Its last id.
    pub fn last(&self) -> u32 {
        self.first.saturating_add(self.count.saturating_sub(1))
    }

    /// Whether `id` is in it.
    pub fn contains(&self, id: u32) -> bool {
        id >= self.first && id <= self.last()
    }

    /// The config keys' own checks (no I/O): at least one id, none of
    /// root's or the overflow ids, at most [`MAX_UID`]. The reason, for
    /// the config error.
    pub fn problem(&self) -> Option<String> {
        if self.count == 0 {
            return Some("holds no uid".into());
        }
        if u64::from(self.first) + u64::from(self.count) - 1 > u64::from(MAX_UID) {
            return Some(format!("goes beyond uid {MAX_UID}"));
        }
        RESERVED
            .iter()
            .find(|r| self.contains(**r))
            .map(|r| format!("holds uid {r} (root or nobody)"))
    }
}
