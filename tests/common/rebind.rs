//! Binding a loopback port again that a stopped stand-in server held a moment ago (an API
//! server restart on the same port); shared by the test fakes and the fleet benchmark.

use std::time::{Duration, Instant};

/// Listens on `127.0.0.1:port` again, trying for up to 10 s: a connection the stop closed
/// may hold the port briefly.
pub fn rebind(port: u16) -> std::net::TcpListener {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match std::net::TcpListener::bind(("127.0.0.1", port)) {
            Ok(listener) => return listener,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Err(err) => panic!("rebinding 127.0.0.1:{port}: {err}"),
        }
    }
}
