//! The accept loop of the harness's loopback servers (the demo upstream, the
//! file server, the etcd relay): one thread accepts, one thread a connection
//! serves, and a stop flag, set by [`stop`], ends the loop.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Listen on 127.0.0.1:`port` (0: any free port) and accept in a thread
/// `<name>-accept` until `stop_flag(&shared)` is set; `serve` each connection
/// in a thread `<name>-conn`. Returns the address and the shared state.
pub fn spawn<S: Send + Sync + 'static>(
    name: &str,
    port: u16,
    shared: S,
    stop_flag: fn(&S) -> &AtomicBool,
    serve: fn(TcpStream, &Arc<S>),
) -> std::io::Result<(SocketAddr, Arc<S>)> {
    let listener = TcpListener::bind(("127.0.0.1", port))?;
    let addr = listener.local_addr()?;
    let shared = Arc::new(shared);
    let accepting = shared.clone();
    let conn_name = format!("{name}-conn");
    std::thread::Builder::new()
        .name(format!("{name}-accept"))
        .spawn(move || {
            for conn in listener.incoming() {
                if stop_flag(&accepting).load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = conn else { continue };
                let s = accepting.clone();
                let _ = std::thread::Builder::new()
                    .name(conn_name.clone())
                    .spawn(move || serve(stream, &s));
            }
        })?;
    Ok((addr, shared))
}

/// Set `stop_flag` and wake the accept loop listening on `addr` (blocked in
/// accept) so that it sees the flag.
pub fn stop(stop_flag: &AtomicBool, addr: SocketAddr) {
    stop_flag.store(true, Ordering::SeqCst);
    let _ = TcpStream::connect_timeout(&addr, Duration::from_millis(200));
}
