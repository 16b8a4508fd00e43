//! The stream machine end to end through the `Plugin`, with the fake host of `fake.rs`
//! and the drivers of `testing.rs`, one file per behaviour.

mod callers;
mod calls;
mod contract;
mod detached;
mod etcd;
mod etcd_retries;
mod expiry;
mod glue;
mod identity;
mod ordering;
mod regions;
mod rules;
mod shards;
mod shared;
mod wait;
