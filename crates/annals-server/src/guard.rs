//! A connection's I/O, guarded at the edge before hyper sees it:
//! - its first bytes must arrive within a deadline: a peer that opens a connection and sends
//!   nothing loses it (hyper's own timers start with the first request);
//! - the three refusals hyper writes itself, with an empty body, before any handler runs (400
//!   for a request it cannot parse, such as a URI holding characters that must be
//!   percent-encoded; 414 for a request line too long; 431 for a head too large) are replaced
//!   by the same answer with the JSON error body every other refusal carries. hyper closes the
//!   connection after them.

use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub(crate) struct Guarded<I> {
    io: I,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A replacement answer still to be written, and how much of it is.
    pending: Option<(Vec<u8>, usize)>,
}

impl<I> Guarded<I> {
    pub(crate) fn new(io: I, first_bytes_within: Duration) -> Self {
        Guarded {
            io,
            deadline: Some(Box::pin(tokio::time::sleep(first_bytes_within))),
            pending: None,
        }
    }
}

/// Whether `bytes` begin an answer hyper may have written bodyless (400, 414 or 431): only
/// those are looked at closer.
fn is_refusal_head(bytes: &[u8]) -> bool {
    bytes.starts_with(b"HTTP/1.1 431 ")
        || bytes.starts_with(b"HTTP/1.1 414 ")
        || bytes.starts_with(b"HTTP/1.1 400 ")
}

/// The JSON answer replacing hyper's bodyless `status` refusal, if `head` is one.
fn replacement(head: &[u8]) -> Option<Vec<u8>> {
    let (status, reason, kind, message) = if head.starts_with(b"HTTP/1.1 431 ") {
        (
            431,
            "Request Header Fields Too Large",
            "headers_too_large",
            "the request's headers are larger than the server accepts",
        )
    } else if head.starts_with(b"HTTP/1.1 414 ") {
        (
            414,
            "URI Too Long",
            "uri_too_long",
            "the request's URI is longer than the server accepts",
        )
    } else if head.starts_with(b"HTTP/1.1 400 ") {
        // Every 400 of ours carries a JSON body, so a bodyless one is hyper's: a request line
        // or header it could not parse. The usual cause is a URI with characters a URI may
        // not hold as they are, such as a query's JSON sent unencoded.
        (
            400,
            "Bad Request",
            "malformed_request",
            "the request is not valid HTTP: its method, URI or a header could not be parsed; \
             percent-encode the query string's values (curl -G --data-urlencode 'query=...')",
        )
    } else {
        return None;
    };
    let bodyless = head
        .windows(b"content-length: 0\r\n".len())
        .any(|w| w.eq_ignore_ascii_case(b"content-length: 0\r\n"));
    if !bodyless {
        return None;
    }
    let error = crate::answers::Error {
        error: message.into(),
        kind: kind.into(),
        violations: Vec::new(),
    };
    let body = serde_json::to_string(&error).expect("an error serializes");
    Some(
        format!(
            "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

impl<I: AsyncWrite + Unpin> Guarded<I> {
    /// Writes what is left of a replacement answer.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while let Some((bytes, written)) = &mut self.pending {
            if *written == bytes.len() {
                self.pending = None;
                break;
            }
            match Pin::new(&mut self.io).poll_write(cx, &bytes[*written..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()))
                }
                Poll::Ready(Ok(n)) => *written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Takes `buf` as written when it is a refusal to replace, queueing the replacement.
    fn replace(
        &mut self,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Option<Poll<std::io::Result<usize>>> {
        let answer = replacement(buf)?;
        self.pending = Some((answer, 0));
        Some(match self.drain(cx) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            _ => Poll::Ready(Ok(buf.len())),
        })
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Guarded<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Some(deadline) = this.deadline.as_mut() {
            match &read {
                Poll::Ready(Ok(())) if buf.filled().len() > before => this.deadline = None,
                Poll::Pending if deadline.as_mut().poll(cx).is_ready() => {
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no request within the header timeout",
                    )));
                }
                _ => {}
            }
        }
        read
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Guarded<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if this.drain(cx)?.is_pending() {
            return Poll::Pending;
        }
        if is_refusal_head(buf) {
            if let Some(done) = this.replace(cx, buf) {
                return done;
            }
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if this.drain(cx)?.is_pending() {
            return Poll::Pending;
        }
        let first = bufs.iter().find(|b| !b.is_empty());
        if first.is_some_and(|b| is_refusal_head(b)) {
            let whole: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            if let Some(done) = this.replace(cx, &whole) {
                return done;
            }
        }
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.drain(cx)?.is_pending() {
            return Poll::Pending;
        }
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.drain(cx)?.is_pending() {
            return Poll::Pending;
        }
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::replacement;

    /// Goal: only hyper's bodyless 400, 414 and 431 are replaced, by the same status with a
    /// JSON body; an answer of ours with a body, and other statuses, pass untouched.
    #[test]
    fn bodyless_refusals_get_a_json_body() {
        let hyper_431 =
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let answer = String::from_utf8(replacement(hyper_431).unwrap()).unwrap();
        assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
        assert!(
            answer.contains("\"kind\":\"headers_too_large\""),
            "{answer}"
        );
        let hyper_414 = b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\n\r\n";
        assert!(String::from_utf8(replacement(hyper_414).unwrap())
            .unwrap()
            .contains("uri_too_long"));
        let ours = b"HTTP/1.1 414 URI Too Long\r\ncontent-type: application/json\r\ncontent-length: 57\r\n\r\n";
        assert!(replacement(ours).is_none());
        let hyper_400 = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
        assert!(String::from_utf8(replacement(hyper_400).unwrap())
            .unwrap()
            .contains("malformed_request"));
        let ours_400 = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 40\r\n\r\n";
        assert!(replacement(ours_400).is_none());
        assert!(replacement(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n").is_none());
    }
}
