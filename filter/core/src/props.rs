//! Property tests that cross modules: every decoder of outside bytes (`decoders`), the
//! canonical JSON form of the payload check (`canon`), and the
//! model-based fuzzing of the whole stream machine against a reference model (`model`),
//! and of the ordering guard against its own (`ordering_model`).
//! The shared-data store's private encodings have theirs in `store_props.rs`.

mod canon;
pub(crate) mod decoders;
mod model;
mod ordering_model;
