//! The load generator's HTTP/1.1 client: one keep-alive connection, one request in flight, the
//! request written from one reused buffer and the answer parsed in place (status, then a body
//! framed by Content-Length or chunked). A benchmark's client shares the machine's cores with
//! the server it measures, so it should cost as little as it can: a request is one write and,
//! usually, one read. (hyper's client connection ran as a task of its own beside each caller,
//! a hand-over each way per request; the benchmark's client used about as much CPU as the
//! server it measured.)

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Headers an answer may carry, at most.
const MAX_HEADERS: usize = 32;
/// The largest answer this client reads (a full read of a million events in `snapshot`'s
/// decide workload is the largest a benchmark asks for).
const MAX_ANSWER: usize = 1 << 30;

pub(crate) struct Http1 {
    stream: TcpStream,
    /// The request being written.
    out: Vec<u8>,
    /// What has been read and not yet consumed.
    input: Vec<u8>,
    /// The last answer's body.
    body: Vec<u8>,
}

/// How an answer's body is framed.
#[derive(Debug, PartialEq, Eq)]
enum Framing {
    Length(usize),
    Chunked,
}

impl Http1 {
    pub(crate) async fn connect(addr: SocketAddr) -> Result<Http1, String> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        Ok(Http1 {
            stream,
            out: Vec::with_capacity(4096),
            input: Vec::with_capacity(64 << 10),
            body: Vec::with_capacity(64 << 10),
        })
    }

    /// Sends one request and reads its whole answer: the status and the body (valid until the
    /// next request). `authorization` is the header's whole value (`Bearer ...`).
    pub(crate) async fn round_trip(
        &mut self,
        method: &str,
        path: &str,
        authorization: Option<&str>,
        body: &[u8],
    ) -> Result<(u16, &[u8]), String> {
        self.out.clear();
        write_request(&mut self.out, method, path, authorization, body);
        self.stream
            .write_all(&self.out)
            .await
            .map_err(|e| format!("send: {e}"))?;
        let (status, framing, head) = loop {
            if let Some(parsed) = parse_head(&self.input)? {
                break parsed;
            }
            self.fill().await?;
        };
        self.input.drain(..head);
        self.body.clear();
        match framing {
            Framing::Length(n) => {
                if n > MAX_ANSWER {
                    return Err(format!("an answer of {n} bytes"));
                }
                while self.input.len() < n {
                    self.fill().await?;
                }
                self.body.extend_from_slice(&self.input[..n]);
                self.input.drain(..n);
            }
            Framing::Chunked => {
                let mut at = 0;
                while !dechunk(&self.input, &mut at, &mut self.body)? {
                    self.fill().await?;
                }
                self.input.drain(..at);
            }
        }
        Ok((status, &self.body))
    }

    /// Reads what the server has sent so far (at least one byte).
    async fn fill(&mut self) -> Result<(), String> {
        if self.input.len() > MAX_ANSWER {
            return Err("an answer larger than the client reads".into());
        }
        receive(&mut self.stream, &mut self.input, 16 << 10).await
    }
}

/// Reads what the server has sent so far (at least one byte) onto the end of `input`, with
/// room for `reserve` bytes more; an error if the server has closed the connection.
pub(crate) async fn receive(
    stream: &mut TcpStream,
    input: &mut Vec<u8>,
    reserve: usize,
) -> Result<(), String> {
    input.reserve(reserve);
    let n = stream
        .read_buf(input)
        .await
        .map_err(|e| format!("receive: {e}"))?;
    if n == 0 {
        return Err("the server closed the connection".into());
    }
    Ok(())
}

fn write_request(
    out: &mut Vec<u8>,
    method: &str,
    path: &str,
    authorization: Option<&str>,
    body: &[u8],
) {
    use std::io::Write;
    // Writing into a Vec cannot fail.
    let _ = write!(out, "{method} {path} HTTP/1.1\r\nhost: annals\r\n");
    if let Some(a) = authorization {
        let _ = write!(out, "authorization: {a}\r\n");
    }
    if !body.is_empty() || method != "GET" {
        let _ = write!(
            out,
            "content-type: application/json\r\ncontent-length: {}\r\n",
            body.len()
        );
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

/// The status, the body's framing and the head's length, once the whole head has arrived.
fn parse_head(input: &[u8]) -> Result<Option<(u16, Framing, usize)>, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let head = match response.parse(input) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("a malformed answer: {e}")),
    };
    let status = response.code.unwrap_or(0);
    let mut framing = Framing::Length(0);
    for h in response.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or("a malformed content-length")?;
            framing = Framing::Length(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding")
            && h.value
                .split(|&b| b == b',')
                .any(|v| v.trim_ascii().eq_ignore_ascii_case(b"chunked"))
        {
            framing = Framing::Chunked;
            break;
        }
    }
    Ok(Some((status, framing, head)))
}

/// Decodes the chunks of a chunked body in `input` from `*at` on into `out`, moving `*at`
/// past each whole chunk: true once the last chunk and the empty line after any trailers
/// have arrived (`*at` is then the body's end), false while more input is needed (call again
/// with more; the chunks decoded so far stay decoded).
fn dechunk(input: &[u8], at: &mut usize, out: &mut Vec<u8>) -> Result<bool, String> {
    loop {
        let Some(line) = find_crlf(&input[*at..]) else {
            return Ok(false);
        };
        let size_line = &input[*at..*at + line];
        let size_text = size_line
            .split(|&b| b == b';')
            .next()
            .unwrap_or(size_line)
            .trim_ascii();
        let size = std::str::from_utf8(size_text)
            .ok()
            .and_then(|s| usize::from_str_radix(s, 16).ok())
            .ok_or("a malformed chunk size")?;
        if size > MAX_ANSWER || out.len() + size > MAX_ANSWER {
            return Err(format!("a chunk of {size} bytes"));
        }
        let data = *at + line + 2;
        if size == 0 {
            // Trailers, if any, then an empty line; `*at` stays on the last chunk until then.
            let mut end = data;
            loop {
                let Some(line) = find_crlf(&input[end..]) else {
                    return Ok(false);
                };
                end += line + 2;
                if line == 0 {
                    *at = end;
                    return Ok(true);
                }
            }
        }
        if input.len() < data + size + 2 {
            return Ok(false);
        }
        if &input[data + size..data + size + 2] != b"\r\n" {
            return Err("a chunk not followed by CRLF".into());
        }
        out.extend_from_slice(&input[data..data + size]);
        *at = data + size + 2;
    }
}

fn find_crlf(input: &[u8]) -> Option<usize> {
    input.windows(2).position(|w| w == b"\r\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the load generator's HTTP client reads a response head only once it has all of it,
    /// with its status and length, and refuses a bad status or length.
    #[test]
    fn a_head_is_parsed_once_whole() {
        let answer = b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{\"head\":42}\n";
        let head_len = answer.len() - 12;
        for cut in 0..head_len {
            assert_eq!(parse_head(&answer[..cut]).unwrap(), None, "cut at {cut}");
        }
        assert_eq!(
            parse_head(answer).unwrap(),
            Some((201, Framing::Length(12), head_len))
        );
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 2x0 OK\r\n\r\n").is_err());
    }

    /// Goal: a response head that announces a chunked body is read as chunked.
    #[test]
    fn a_chunked_head_says_so() {
        let answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(
            parse_head(answer).unwrap(),
            Some((200, Framing::Chunked, answer.len()))
        );
    }

    /// Goal: a chunked body decodes to its data wherever the reads split it, extensions and
    /// trailers skipped, stopping where the next response begins.
    #[test]
    fn a_chunked_body_is_decoded_from_any_split() {
        let body = b"5\r\nhello\r\n1;ext=1\r\n,\r\n6\r\n world\r\n0\r\ntrailer: x\r\n\r\nNEXT";
        let whole = body.len() - 4;
        for cut in 0..whole {
            // Fed in two pieces, split at `cut`, as reads deliver them.
            let (mut at, mut out) = (0, Vec::new());
            assert!(
                !dechunk(&body[..cut], &mut at, &mut out).unwrap(),
                "cut at {cut}"
            );
            assert!(at <= cut);
            assert!(dechunk(body, &mut at, &mut out).unwrap(), "cut at {cut}");
            assert_eq!(
                (at, &out[..]),
                (whole, &b"hello, world"[..]),
                "cut at {cut}"
            );
        }
        let (mut at, mut out) = (0, Vec::new());
        assert!(dechunk(b"0\r\n\r\n", &mut at, &mut out).unwrap());
        assert_eq!(at, 5);
        assert!(out.is_empty());
    }

    /// Goal: a chunk with a bad size or without its line end is an error, not data.
    #[test]
    fn a_malformed_chunk_is_an_error() {
        let mut out = Vec::new();
        assert!(dechunk(b"zz\r\nab\r\n0\r\n\r\n", &mut 0, &mut out).is_err());
        assert!(dechunk(b"2\r\nabXY0\r\n\r\n", &mut 0, &mut out).is_err());
    }

    /// Goal: the load generator's HTTP requests carry the body's length and type and the API key
    /// when there is one, and nothing for an empty request.
    #[test]
    fn a_request_carries_its_length_and_key() {
        let mut out = Vec::new();
        write_request(&mut out, "POST", "/v1/append", Some("Bearer k"), b"{}");
        assert_eq!(
            out,
            b"POST /v1/append HTTP/1.1\r\nhost: annals\r\nauthorization: Bearer k\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
        );
        out.clear();
        write_request(&mut out, "GET", "/v1/read", None, b"");
        assert_eq!(out, b"GET /v1/read HTTP/1.1\r\nhost: annals\r\n\r\n");
    }

    #[tokio::test]
    async fn a_round_trip_against_a_scripted_server() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            // Two requests on one connection; the answers arrive in pieces.
            for answer in [
                &b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"[..],
                &b"HTTP/1.1 409 Conflict\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"[..],
            ] {
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = socket.read(&mut buf).await.unwrap();
                    seen.extend_from_slice(&buf[..n]);
                }
                seen.clear();
                for piece in answer.chunks(7) {
                    socket.write_all(piece).await.unwrap();
                    socket.flush().await.unwrap();
                    tokio::task::yield_now().await;
                }
            }
        });
        let mut client = Http1::connect(addr).await.unwrap();
        let (status, body) = client.round_trip("GET", "/a", None, b"").await.unwrap();
        assert_eq!((status, body), (200, &b"hello"[..]));
        let (status, body) = client.round_trip("GET", "/b", None, b"").await.unwrap();
        assert_eq!((status, body), (409, &b"abc"[..]));
        server.await.unwrap();
        assert!(client.round_trip("GET", "/c", None, b"").await.is_err());
    }
}
