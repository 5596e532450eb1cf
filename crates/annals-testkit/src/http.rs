//! A small blocking HTTP/1.1 client for the end-to-end tests, which can also misbehave on
//! purpose (only the headers given, a request written by hand): one request per connection,
//! an answer read whole (by its length, chunked or to the close), and a streaming GET read line
//! by line (NDJSON or SSE).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A query parameter's value percent-encoded (everything but letters, digits and `-_.~`).
pub fn encode(s: &str) -> String {
    use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
    const RESERVED: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    utf8_percent_encode(s, RESERVED).to_string()
}

/// An answer: its status, its headers (names in lower case) and its body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The error kind of a JSON error answer.
    pub fn kind(&self) -> String {
        self.json()["kind"].as_str().unwrap_or_default().to_string()
    }
}

/// One request on a fresh connection (`Connection: close`); a body without a Content-Type
/// goes as `application/json`.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut headers = headers.to_vec();
    if !body.is_empty()
        && !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        headers.push(("content-type", "application/json"));
    }
    request_exactly(addr, method, path, &headers, body)
}

/// One request on a fresh connection (`Connection: close`), with only the headers given.
pub fn request_exactly(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    read_response(&mut BufReader::new(stream))
}

/// Reads one response (content-length, chunked, or until close).
pub fn read_response(reader: &mut impl BufRead) -> Response {
    let mut status_line = String::new();
    reader.read_line(&mut status_line).unwrap();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':').unwrap();
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let find = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if let Some(len) = find("content-length") {
        body.resize(len.parse().unwrap(), 0);
        reader.read_exact(&mut body).unwrap();
    } else if find("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).unwrap();
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            let mut chunk = vec![0; n + 2];
            reader.read_exact(&mut chunk).unwrap();
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        let _ = reader.read_to_end(&mut body);
    }
    Response {
        status,
        headers,
        body,
    }
}

/// A streaming GET whose chunked body is read line by line (NDJSON or SSE).
pub struct Stream {
    reader: BufReader<TcpStream>,
    pending: Vec<u8>,
    pub status: u16,
}

impl Stream {
    pub fn open(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Stream {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut head = format!("GET {path} HTTP/1.1\r\nhost: test\r\n");
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        (&stream).write_all(head.as_bytes()).unwrap();
        let mut reader = BufReader::new(stream);
        let mut status_line = String::new();
        reader.read_line(&mut status_line).unwrap();
        let status = status_line
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line.trim_end().is_empty() {
                break;
            }
        }
        Stream {
            reader,
            pending: Vec::new(),
            status,
        }
    }

    /// The next line of the (chunked) body, without its newline; None when the body ends.
    pub fn next_line(&mut self) -> Option<String> {
        loop {
            if let Some(at) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=at).collect();
                return Some(String::from_utf8_lossy(&line[..line.len() - 1]).into_owned());
            }
            let mut size = String::new();
            if self.reader.read_line(&mut size).ok()? == 0 {
                return None;
            }
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            let mut chunk = vec![0; n + 2];
            self.reader.read_exact(&mut chunk).ok()?;
            if n == 0 {
                return None;
            }
            self.pending.extend_from_slice(&chunk[..n]);
        }
    }
}

/// A JSON append body of events `(type, tags, data)` with an optional condition (JSON text).
pub fn append_body(events: &[(&str, &[&str], &str)], condition: Option<&str>) -> String {
    let events: Vec<serde_json::Value> = events
        .iter()
        .map(|(t, tags, data)| serde_json::json!({"type": t, "tags": tags, "data": data}))
        .collect();
    let mut body = serde_json::json!({ "events": events });
    if let Some(c) = condition {
        body["condition"] = serde_json::from_str(c).unwrap();
    }
    body.to_string()
}
