//! The shared-data store's geometry, a leaf both the configuration (its bounds and
//! budgets) and the store read: records per bucket.

/// Records per bucket (pinned: the bucket encoding has this many ways).
pub const WAYS: usize = 16;
