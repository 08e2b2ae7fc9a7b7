//! The benchmarks' HTTP/1.1 client: one `GET` at a time on a connection kept alive, reconnecting
//! when the server closes it after an answer (HTTP/1.0 servers such as Python's do), and the
//! latency figures of a run.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// One answer.
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
    /// The server closes the connection after this answer.
    pub closes: bool,
}

/// A keep-alive connection to a loopback port.
pub struct Client {
    port: u16,
    stream: Option<BufReader<TcpStream>>,
}

impl Client {
    /// A client that connects on its first request.
    pub fn new(port: u16) -> Client {
        Client { port, stream: None }
    }

    /// Connects now, so that a later request's latency leaves the handshake out.
    pub fn connected(port: u16) -> Result<Client, Error> {
        let mut client = Client::new(port);
        client.connect()?;
        Ok(client)
    }

    fn connect(&mut self) -> Result<&mut BufReader<TcpStream>, Error> {
        if self.stream.is_none() {
            let stream = TcpStream::connect(("127.0.0.1", self.port))?;
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(Duration::from_secs(10)))?;
            self.stream = Some(BufReader::with_capacity(256 * 1024, stream));
        }
        self.stream.as_mut().ok_or_else(|| "no connection".into())
    }

    /// `GET path`, connecting first when the last answer closed the connection.
    pub fn get(&mut self, path: &str) -> Result<Response, Error> {
        let stream = self.connect()?;
        write!(
            stream.get_mut(),
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        )?;
        let response = read_response(stream)?;
        if response.closes {
            self.stream = None;
        }
        Ok(response)
    }
}

/// One request on a fresh connection that is closed after it.
pub fn get_once(port: u16, path: &str) -> Result<Response, Error> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    read_response(&mut BufReader::new(stream))
}

/// Reads one response: status line, headers, then a `Content-Length` body, or the rest of the
/// stream without one.
fn read_response(reader: &mut BufReader<TcpStream>) -> Result<Response, Error> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let http10 = line.starts_with("HTTP/1.0");
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {line:?}"))?;
    let mut length = None;
    let mut connection = None;
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = Some(value.trim().parse::<usize>()?);
            } else if name.eq_ignore_ascii_case("connection") {
                connection = Some(value.trim().to_ascii_lowercase());
            }
        }
    }
    let mut body = Vec::new();
    match length {
        Some(length) => {
            body.resize(length, 0);
            reader.read_exact(&mut body)?;
        }
        None => {
            reader.read_to_end(&mut body)?;
        }
    }
    let closes = length.is_none()
        || connection.as_deref() == Some("close")
        || (http10 && connection.as_deref() != Some("keep-alive"));
    Ok(Response {
        status,
        body,
        closes,
    })
}

/// Latencies of a run, sorted.
pub struct Latencies(Vec<Duration>);

impl Latencies {
    pub fn new(mut all: Vec<Duration>) -> Latencies {
        all.sort();
        Latencies(all)
    }

    /// The `p` quantile (0 to 1), nearest rank.
    pub fn percentile(&self, p: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let i = ((self.0.len() as f64 - 1.0) * p).round() as usize;
        self.0[i]
    }

    pub fn max(&self) -> Duration {
        self.0.last().copied().unwrap_or_default()
    }
}

/// Milliseconds, for printing.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
