//! The load generator's gRPC client: HTTP/2 in clear text (RFC 9113) over one TCP connection,
//! written directly on the frames. Several calls are in flight on the connection at once, one
//! per stream; the caller starts calls and collects their answers. Requests are framed into one
//! reused buffer and go out with one write per round, however many there are, and answers are
//! parsed in place from what each read brings. A benchmark's client shares the machine's cores
//! with the server it measures, so it should cost as little as it can. (On the `h2` crate, whose
//! connection runs as a task beside its callers, each call a task of its own and a hand-over
//! each way, the load generator used a third more CPU per call than the HTTP/1.1 one did.)
//!
//! What a gRPC call needs and no more: request headers are sent as HPACK literals (never
//! indexed, never Huffman-coded, so a path's header block is built once); answers' headers are
//! decoded in full (the server's encoder may index and Huffman-code them), and only `:status`,
//! `grpc-status` and `grpc-message` are kept; answers' messages are counted, not decoded. Flow
//! control is honoured both ways: a message goes out as far as the connection's and its
//! stream's windows allow, the rest as the server widens them; this client gives the server
//! windows so large that answers never wait for them, handing the connection's back as it
//! reads. The server's settings are awaited before the first call, so that its limit on
//! concurrent streams holds from the start (calls beyond it wait for a stream to end).

use std::collections::VecDeque;
use std::net::SocketAddr;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::h2wire::*;

/// The window this client gives each stream and the connection: a benchmark's answers never
/// wait for it.
const RECEIVE_WINDOW: u32 = 1 << 30;
/// The largest frame this client accepts.
const MAX_FRAME_IN: usize = 1 << 20;
/// The connection's window is handed back once this much data has been read.
const WINDOW_STEP: u64 = 16 << 20;

/// A finished call: its gRPC status code and message. A call the server reset, or that ended
/// without a status, is `UNKNOWN` (2) with a message saying so.
pub(crate) type Status = (i32, String);

pub(crate) struct GrpcClient {
    stream: TcpStream,
    /// What is to be written: requests and control frames.
    out: Vec<u8>,
    /// What has been read and not yet parsed.
    input: Vec<u8>,
    decoder: loona_hpack::Decoder<'static>,
    /// The header block of a call to each path given to `connect`.
    header_blocks: Vec<Vec<u8>>,
    /// The next call's message, framed for gRPC (reused).
    message: Vec<u8>,
    next_stream_id: u32,
    /// Calls in flight (a few: searched in order).
    calls: Vec<Call>,
    /// Calls waiting for a stream, in the order they were started.
    waiting: VecDeque<Waiting>,
    /// What the connection may still send, and what a new stream may (the server's initial
    /// window).
    send_window: i64,
    stream_window: i64,
    max_frame: usize,
    max_streams: usize,
    /// Data read since the connection's window was last handed back.
    unreturned: u64,
    /// A header block still being received (CONTINUATION frames follow): its stream, whether
    /// it ends the stream, and the fragments so far.
    continued: Option<(u32, bool)>,
    block: Vec<u8>,
    /// Whether the server's first SETTINGS frame has arrived.
    settled: bool,
}

#[derive(Default)]
struct Call {
    stream_id: u32,
    tag: usize,
    /// What the stream may still send, and what of its message the windows held back.
    window: i64,
    unsent: Vec<u8>,
    http_status: Option<u16>,
    status: Option<i32>,
    message: String,
}

struct Waiting {
    path: usize,
    message: Vec<u8>,
    tag: usize,
}

impl GrpcClient {
    /// Connects to `addr` and opens the HTTP/2 connection. Calls may go to any of `paths`
    /// (`/package.Service/Method`), each with `authorization` (the header's whole value) if
    /// given.
    pub(crate) async fn connect(
        addr: SocketAddr,
        authorization: Option<&str>,
        paths: &[&str],
    ) -> Result<GrpcClient, String> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let authority = addr.to_string();
        let mut client = GrpcClient {
            stream,
            out: Vec::with_capacity(64 << 10),
            input: Vec::with_capacity(64 << 10),
            decoder: loona_hpack::Decoder::new(),
            header_blocks: paths
                .iter()
                .map(|path| header_block(path, &authority, authorization))
                .collect(),
            message: Vec::with_capacity(4096),
            next_stream_id: 1,
            calls: Vec::new(),
            waiting: VecDeque::new(),
            send_window: DEFAULT_WINDOW,
            stream_window: DEFAULT_WINDOW,
            max_frame: DEFAULT_MAX_FRAME,
            max_streams: usize::MAX,
            unreturned: 0,
            continued: None,
            block: Vec::new(),
            settled: false,
        };
        client.out.extend_from_slice(PREFACE);
        let settings: [(u16, u32); 3] = [
            (SETTINGS_ENABLE_PUSH, 0),
            (SETTINGS_INITIAL_WINDOW_SIZE, RECEIVE_WINDOW),
            (SETTINGS_MAX_FRAME_SIZE, MAX_FRAME_IN as u32),
        ];
        crate::h2wire::settings(&mut client.out, &settings);
        window_update(&mut client.out, 0, RECEIVE_WINDOW - DEFAULT_WINDOW as u32);
        client.flush().await?;
        let mut none = Vec::new();
        while !client.settled {
            client.answers(&mut none).await?;
        }
        client.flush().await?;
        Ok(client)
    }

    /// Calls in flight or waiting to be sent.
    pub(crate) fn pending(&self) -> usize {
        self.calls.len() + self.waiting.len()
    }

    /// Starts a call of `paths[path]` (as given to `connect`) with one request `message`; its
    /// answer comes back from [`GrpcClient::answers`] with `tag`. The request goes out with the
    /// next [`GrpcClient::flush`] (what the server's windows hold back, as they widen), or
    /// once a stream is free.
    pub(crate) fn start(
        &mut self,
        path: usize,
        message: &impl prost::Message,
        tag: usize,
    ) -> Result<(), String> {
        let mut framed = std::mem::take(&mut self.message);
        framed.clear();
        let len = message.encoded_len();
        framed.push(0);
        framed.extend_from_slice(&(len as u32).to_be_bytes());
        message
            .encode(&mut framed)
            .map_err(|e| format!("encode: {e}"))?;
        let result = if self.waiting.is_empty() && self.calls.len() < self.max_streams {
            self.send(path, &framed, tag)
        } else {
            self.waiting.push_back(Waiting {
                path,
                message: framed.clone(),
                tag,
            });
            Ok(())
        };
        self.message = framed;
        result
    }

    /// Writes what is ready to go.
    pub(crate) async fn flush(&mut self) -> Result<(), String> {
        if self.out.is_empty() {
            return Ok(());
        }
        self.stream
            .write_all(&self.out)
            .await
            .map_err(|e| format!("send: {e}"))?;
        self.out.clear();
        Ok(())
    }

    /// Waits for what the server sends next and handles all of it, adding each call it
    /// finishes to `done` as `(tag, status)`. An error means the connection is broken.
    pub(crate) async fn answers(&mut self, done: &mut Vec<(usize, Status)>) -> Result<(), String> {
        crate::http1::receive(&mut self.stream, &mut self.input, 64 << 10).await?;
        let input = std::mem::take(&mut self.input);
        let mut at = 0;
        let result = loop {
            let frame = match next_frame(&input[at..], MAX_FRAME_IN) {
                Ok(Some(frame)) => frame,
                Ok(None) => break Ok(()),
                Err(len) => break Err(format!("a frame of {len} bytes")),
            };
            at += 9 + frame.payload.len();
            if let Err(e) = self.frame(frame, done) {
                break Err(e);
            }
        };
        self.input = input;
        self.input.drain(..at);
        result?;
        if self.unreturned >= WINDOW_STEP {
            window_update(&mut self.out, 0, self.unreturned as u32);
            self.unreturned = 0;
        }
        // Messages held back by the windows, in the order their calls started, then calls
        // waiting for a stream.
        for i in 0..self.calls.len() {
            if self.send_window <= 0 {
                break;
            }
            if !self.calls[i].unsent.is_empty() {
                let mut call = std::mem::take(&mut self.calls[i]);
                let unsent = std::mem::take(&mut call.unsent);
                self.send_data(&mut call, &unsent);
                self.calls[i] = call;
            }
        }
        while self.calls.len() < self.max_streams {
            let Some(next) = self.waiting.pop_front() else {
                break;
            };
            self.send(next.path, &next.message, next.tag)?;
        }
        Ok(())
    }

    /// Frames a call on a new stream: its headers, then its message.
    fn send(&mut self, path: usize, message: &[u8], tag: usize) -> Result<(), String> {
        let stream_id = self.next_stream_id;
        if stream_id > LAST_STREAM_ID {
            return Err("the connection has used all its stream identifiers".into());
        }
        self.next_stream_id += 2;
        let block = &self.header_blocks[path];
        if block.len() > self.max_frame {
            return Err("a header block larger than the server's frame size".into());
        }
        frame_head(&mut self.out, block.len(), HEADERS, END_HEADERS, stream_id);
        self.out.extend_from_slice(block);
        let mut call = Call {
            stream_id,
            tag,
            window: self.stream_window,
            ..Call::default()
        };
        self.send_data(&mut call, message);
        self.calls.push(call);
        Ok(())
    }

    /// Frames as much of `message` (what is left of `call`'s) as the windows allow, the last
    /// frame ending the stream; keeps the rest in `call.unsent`.
    fn send_data(&mut self, call: &mut Call, message: &[u8]) {
        let mut at = 0;
        while at < message.len() {
            let room = self.send_window.min(call.window).min(self.max_frame as i64);
            if room <= 0 {
                break;
            }
            let end = message.len().min(at + room as usize);
            let flags = if end == message.len() { END_STREAM } else { 0 };
            frame_head(&mut self.out, end - at, DATA, flags, call.stream_id);
            self.out.extend_from_slice(&message[at..end]);
            self.send_window -= (end - at) as i64;
            call.window -= (end - at) as i64;
            at = end;
        }
        call.unsent.clear();
        call.unsent.extend_from_slice(&message[at..]);
    }

    fn frame(&mut self, frame: Frame<'_>, done: &mut Vec<(usize, Status)>) -> Result<(), String> {
        let Frame {
            kind,
            flags,
            stream_id,
            payload,
        } = frame;
        if self.continued.is_some() && kind != CONTINUATION {
            return Err("a header block interrupted by another frame".into());
        }
        match kind {
            DATA => {
                self.unreturned += payload.len() as u64;
                unpadded(flags, payload).ok_or("padding longer than its frame")?;
                if flags & END_STREAM != 0 {
                    self.finish(stream_id, done);
                }
            }
            HEADERS => {
                let mut fragment =
                    unpadded(flags, payload).ok_or("padding longer than its frame")?;
                if flags & PRIORITY != 0 {
                    fragment = fragment.get(5..).ok_or("a short HEADERS frame")?;
                }
                let ends_stream = flags & END_STREAM != 0;
                if flags & END_HEADERS != 0 {
                    self.headers(stream_id, fragment, ends_stream, done)?;
                } else {
                    self.block.clear();
                    self.block.extend_from_slice(fragment);
                    self.continued = Some((stream_id, ends_stream));
                }
            }
            CONTINUATION => {
                let Some((id, ends_stream)) = self.continued else {
                    return Err("a CONTINUATION frame with no header block".into());
                };
                if id != stream_id {
                    return Err("a CONTINUATION frame on another stream".into());
                }
                self.block.extend_from_slice(payload);
                if flags & END_HEADERS != 0 {
                    self.continued = None;
                    let block = std::mem::take(&mut self.block);
                    let result = self.headers(stream_id, &block, ends_stream, done);
                    self.block = block;
                    result?;
                }
            }
            RST_STREAM => {
                let code = be_u32(payload).ok_or("a short RST_STREAM frame")?;
                if let Some(call) = self.call(stream_id) {
                    call.status = Some(2);
                    call.message = format!("the server reset the stream (error code {code})");
                }
                self.finish(stream_id, done);
            }
            SETTINGS if flags & ACK == 0 => {
                if !payload.len().is_multiple_of(6) {
                    return Err("a SETTINGS frame of a wrong length".into());
                }
                for setting in payload.chunks(6) {
                    let id = u16::from_be_bytes([setting[0], setting[1]]);
                    let value = be_u32(&setting[2..]).expect("six bytes");
                    match id {
                        // A change applies to the streams open, too (RFC 9113 6.9.2).
                        SETTINGS_INITIAL_WINDOW_SIZE => {
                            let change = value as i64 - self.stream_window;
                            self.calls.iter_mut().for_each(|c| c.window += change);
                            self.stream_window = value as i64;
                        }
                        SETTINGS_MAX_FRAME_SIZE => self.max_frame = value as usize,
                        SETTINGS_MAX_CONCURRENT_STREAMS => self.max_streams = value as usize,
                        _ => {}
                    }
                }
                frame_head(&mut self.out, 0, SETTINGS, ACK, 0);
                self.settled = true;
            }
            PING if flags & ACK == 0 => {
                frame_head(&mut self.out, payload.len(), PING, ACK, 0);
                self.out.extend_from_slice(payload);
            }
            WINDOW_UPDATE => {
                let increment = be_u32(payload).ok_or("a short WINDOW_UPDATE frame")?;
                let increment = (increment & LAST_STREAM_ID) as i64;
                if stream_id == 0 {
                    self.send_window += increment;
                } else if let Some(call) = self.call(stream_id) {
                    call.window += increment;
                }
            }
            GOAWAY => {
                let code = payload.get(4..).and_then(be_u32).unwrap_or(0);
                return Err(format!(
                    "the server is closing the connection (GOAWAY, error code {code})"
                ));
            }
            PUSH_PROMISE => return Err("a server push, which this client refused".into()),
            // Acknowledgements, priorities and unknown frames.
            _ => {}
        }
        Ok(())
    }

    /// A whole header block for `stream_id`: decoded whatever its stream (the decoder's table
    /// follows every block), kept if it belongs to a call in flight.
    fn headers(
        &mut self,
        stream_id: u32,
        block: &[u8],
        ends_stream: bool,
        done: &mut Vec<(usize, Status)>,
    ) -> Result<(), String> {
        let (mut http_status, mut status, mut message) = (None, None, None);
        self.decoder
            .decode_with_cb(block, |name, value| match &name[..] {
                b":status" => http_status = parse::<u16>(&value),
                b"grpc-status" => status = parse::<i32>(&value),
                b"grpc-message" => message = Some(String::from_utf8_lossy(&value).into_owned()),
                _ => {}
            })
            .map_err(|e| format!("a header block that does not decode: {e:?}"))?;
        if let Some(call) = self.call(stream_id) {
            if http_status.is_some() {
                call.http_status = http_status;
            }
            if status.is_some() {
                call.status = status;
            }
            if let Some(message) = message {
                call.message = message;
            }
        }
        if ends_stream {
            self.finish(stream_id, done);
        }
        Ok(())
    }

    fn call(&mut self, stream_id: u32) -> Option<&mut Call> {
        self.calls.iter_mut().find(|c| c.stream_id == stream_id)
    }

    /// The stream has ended: its call is done.
    fn finish(&mut self, stream_id: u32, done: &mut Vec<(usize, Status)>) {
        let Some(i) = self.calls.iter().position(|c| c.stream_id == stream_id) else {
            return;
        };
        let call = self.calls.swap_remove(i);
        let status = match (call.http_status, call.status) {
            (Some(200), Some(code)) => (code, call.message),
            (_, Some(2)) => (2, call.message),
            (Some(200), None) => (2, "an answer without a gRPC status".into()),
            (Some(http), _) => (2, format!("HTTP status {http}")),
            (None, _) => (2, "an answer without a status".into()),
        };
        done.push((call.tag, status));
    }
}

fn parse<T: std::str::FromStr>(value: &[u8]) -> Option<T> {
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// The HPACK header block of a gRPC call to `path` (RFC 7541): `:method POST` and `:scheme
/// http` from the static table, the rest literals that the server's decoder does not index
/// (the authorization one marked never to be).
fn header_block(path: &str, authority: &str, authorization: Option<&str>) -> Vec<u8> {
    // Static table indexes (RFC 7541 appendix A).
    const METHOD_POST: usize = 3;
    const SCHEME_HTTP: usize = 6;
    const AUTHORITY: usize = 1;
    const PATH: usize = 4;
    const CONTENT_TYPE: usize = 31;
    const AUTHORIZATION: usize = 23;
    let mut out = Vec::new();
    integer(&mut out, 7, 0x80, METHOD_POST);
    integer(&mut out, 7, 0x80, SCHEME_HTTP);
    literal(&mut out, 0x00, PATH, b"", path.as_bytes());
    literal(&mut out, 0x00, AUTHORITY, b"", authority.as_bytes());
    literal(&mut out, 0x00, CONTENT_TYPE, b"", b"application/grpc");
    if let Some(authorization) = authorization {
        literal(&mut out, 0x10, AUTHORIZATION, b"", authorization.as_bytes());
    }
    // `te: trailers`, a name the static table lacks.
    literal(&mut out, 0x00, 0, b"te", b"trailers");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::time::Duration;
    use umadb_proto::v1;

    /// Goal: the load generator's gRPC header block decodes, with a standard HPACK decoder, to the
    /// call's headers in order, a long authorization included.
    #[test]
    fn a_header_block_decodes_to_the_call() {
        let long_key = format!("Bearer {}", "k".repeat(300));
        let block = header_block("/umadb.v1.DCB/Append", "127.0.0.1:1", Some(&long_key));
        let mut headers = Vec::new();
        loona_hpack::Decoder::new()
            .decode_with_cb(&block, |n, v| {
                headers.push((n.into_owned(), v.into_owned()))
            })
            .unwrap();
        let expected: Vec<(Vec<u8>, Vec<u8>)> = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/umadb.v1.DCB/Append"),
            (":authority", "127.0.0.1:1"),
            ("content-type", "application/grpc"),
            ("authorization", long_key.as_str()),
            ("te", "trailers"),
        ]
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect();
        assert_eq!(headers, expected);
    }

    /// An HTTP/2 server on the `h2` crate that answers by path: `Ok` with one message (the
    /// request's length) and trailers, `Fail` trailers-only with status 9, `Reset` by resetting
    /// the stream. It allows two streams at a time and checks each request's headers.
    async fn scripted_server() -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let mut connection = h2::server::Builder::new()
                .max_concurrent_streams(2)
                .handshake::<_, Bytes>(socket)
                .await
                .unwrap();
            while let Some(request) = connection.accept().await {
                let (request, mut respond) = request.unwrap();
                tokio::spawn(async move {
                    let headers = request.headers();
                    assert_eq!(headers["content-type"], "application/grpc");
                    assert_eq!(headers["te"], "trailers");
                    assert_eq!(headers["authorization"], "Bearer k");
                    let path = request.uri().path().to_owned();
                    let mut body = request.into_body();
                    let mut len = 0;
                    while let Some(chunk) = body.data().await {
                        let chunk = chunk.unwrap();
                        len += chunk.len();
                        let _ = body.flow_control().release_capacity(chunk.len());
                    }
                    let answer = |status: Option<&str>| {
                        let mut answer = http::Response::builder()
                            .status(200)
                            .header("content-type", "application/grpc");
                        if let Some(status) = status {
                            answer = answer
                                .header("grpc-status", status)
                                .header("grpc-message", "no");
                        }
                        answer.body(()).unwrap()
                    };
                    match path.as_str() {
                        "/t.S/Ok" => {
                            let mut stream = respond.send_response(answer(None), false).unwrap();
                            let message = v1::HeadResponse {
                                position: Some(len as u64),
                            };
                            let mut framed = vec![0];
                            framed.extend_from_slice(
                                &(prost::Message::encoded_len(&message) as u32).to_be_bytes(),
                            );
                            prost::Message::encode(&message, &mut framed).unwrap();
                            stream.send_data(Bytes::from(framed), false).unwrap();
                            let mut trailers = http::HeaderMap::new();
                            trailers.insert("grpc-status", "0".parse().unwrap());
                            stream.send_trailers(trailers).unwrap();
                        }
                        "/t.S/Fail" => {
                            respond.send_response(answer(Some("9")), true).unwrap();
                        }
                        _ => respond.send_reset(h2::Reason::CANCEL),
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn calls_are_answered_by_status_over_one_connection() {
        let addr = scripted_server().await;
        let paths = ["/t.S/Ok", "/t.S/Fail", "/t.S/Reset"];
        let mut client = GrpcClient::connect(addr, Some("Bearer k"), &paths)
            .await
            .unwrap();
        let event = |bytes: usize| v1::Event {
            event_type: "E".into(),
            tags: Vec::new(),
            data: vec![7; bytes],
            uuid: String::new(),
            metadata: Vec::new(),
        };
        // More calls than the server allows streams, and a message larger than a frame and
        // than a stream's window (the server's is the default, 64 KiB).
        let calls = [(0, 10), (1, 10), (2, 10), (0, 100_000), (0, 10), (1, 10)];
        for (tag, (path, bytes)) in calls.iter().enumerate() {
            client.start(*path, &event(*bytes), tag).unwrap();
        }
        assert_eq!(client.pending(), calls.len());
        let mut done = Vec::new();
        let all_answered = async {
            while client.pending() > 0 {
                client.flush().await.unwrap();
                client.answers(&mut done).await.unwrap();
            }
        };
        tokio::time::timeout(Duration::from_secs(20), all_answered)
            .await
            .expect("every call answered");
        done.sort_by_key(|(tag, _)| *tag);
        let codes: Vec<i32> = done.iter().map(|(_, (code, _))| *code).collect();
        assert_eq!(codes, [0, 9, 2, 0, 0, 9]);
        assert_eq!(done[1].1 .1, "no");
        assert!(done[2].1 .1.contains("reset"), "{}", done[2].1 .1);
        assert_eq!(client.next_stream_id, 13, "six streams");
    }
}
