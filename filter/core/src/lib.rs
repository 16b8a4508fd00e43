//! proxy-dedup core logic.
