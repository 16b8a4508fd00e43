//! Free loopback ports, never handed out twice by one process.

use crate::{fail, Result};
use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::Mutex;

static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A port on 127.0.0.1 that was free a moment ago. The kernel may in theory
/// give it to someone else before it is used; within this process it is unique.
pub fn free_port() -> Result<u16> {
    for _ in 0..50 {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if given.get_or_insert_with(HashSet::new).insert(port) {
            return Ok(port);
        }
    }
    fail!("no free loopback port found")
}
