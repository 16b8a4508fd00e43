//! The demo "orders" service on its own: `demo-upstream [PORT]` (default 8080), loopback only.
//! See `dedup_envoy::upstream` for what it answers.

use dedup_envoy::DemoUpstream;

fn main() {
    let port = match std::env::args().nth(1).map(|p| p.parse::<u16>()) {
        None => 8080,
        Some(Ok(p)) => p,
        Some(Err(_)) => {
            eprintln!("usage: demo-upstream [PORT]");
            std::process::exit(2);
        }
    };
    match DemoUpstream::start(port, true) {
        Ok(up) => {
            eprintln!(
                "demo-upstream on http://{} (GET /__executions, POST /__reset; x-demo-delay-ms, x-demo-status)",
                up.addr()
            );
            loop {
                std::thread::park();
            }
        }
        Err(e) => {
            eprintln!("demo-upstream: {e}");
            std::process::exit(1);
        }
    }
}
