//! A minimal HTTP GET for the image test: prints the body of `http://HOST:PORT/PATH`, exits 1
//! on any error or a status other than 200.
//!
//! gpud's image has no shell and no curl; this client, built on the host against the same
//! libc the image carries, is bind-mounted into a second container of the image to scrape the
//! exporter across a container network, as Prometheus would.
//!
//! ```sh
//! cargo run --example scrape -- HOST:PORT /metrics
//! ```

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::time::Duration;

fn get(address: &str, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(std::io::Error::other(
            head.lines().next().unwrap_or("").to_owned(),
        ));
    }
    Ok(body.to_owned())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [address, path] = args.as_slice() else {
        eprintln!("usage: scrape HOST:PORT PATH");
        return ExitCode::from(64);
    };
    match get(address, path) {
        Ok(body) => {
            print!("{body}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("scrape: http://{address}{path}: {err}");
            ExitCode::FAILURE
        }
    }
}
