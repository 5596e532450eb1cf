//! HTTP/2 on the wire (RFC 9113) and the part of HPACK (RFC 7541) that a sender of literals
//! needs: frame types, flags and settings, splitting frames off a buffer, writing frame heads.
//! Used by the load generator's gRPC client.

/// What every HTTP/2 connection begins with, from the client.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// Frame types (RFC 9113 section 6).
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PUSH_PROMISE: u8 = 0x5;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

// Frame flags.
pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;

// Settings (RFC 9113 section 6.5.2).
pub const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;

/// A window until the peer's settings say otherwise.
pub const DEFAULT_WINDOW: i64 = 65_535;
/// The frame size every endpoint accepts until it says otherwise.
pub const DEFAULT_MAX_FRAME: usize = 16_384;
/// Stream identifiers are 31 bits.
pub const LAST_STREAM_ID: u32 = (1 << 31) - 1;

/// One frame, its payload borrowed from the buffer it was read into.
pub struct Frame<'a> {
    pub kind: u8,
    pub flags: u8,
    pub stream_id: u32,
    pub payload: &'a [u8],
}

/// The first frame in `input` once it has arrived whole; an error if its header announces more
/// than `max_len` bytes of payload.
pub fn next_frame(input: &[u8], max_len: usize) -> Result<Option<Frame<'_>>, usize> {
    let Some(head) = input.get(..9) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    if len > max_len {
        return Err(len);
    }
    Ok(input.get(9..9 + len).map(|payload| Frame {
        kind: head[3],
        flags: head[4],
        stream_id: be_u32(&head[5..9]).expect("four bytes") & LAST_STREAM_ID,
        payload,
    }))
}

/// A frame's payload without its padding, or `None` when the padding is longer than the frame.
pub fn unpadded(flags: u8, payload: &[u8]) -> Option<&[u8]> {
    if flags & PADDED == 0 {
        return Some(payload);
    }
    let pad = *payload.first()? as usize;
    let end = payload.len().checked_sub(1 + pad)?;
    Some(&payload[1..1 + end])
}

pub fn be_u32(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(bytes.get(..4)?.try_into().ok()?))
}

pub fn frame_head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream_id: u32) {
    out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream_id.to_be_bytes());
}

pub fn window_update(out: &mut Vec<u8>, stream_id: u32, increment: u32) {
    frame_head(out, 4, WINDOW_UPDATE, 0, stream_id);
    out.extend_from_slice(&increment.to_be_bytes());
}

/// A SETTINGS frame with `settings` as (identifier, value) pairs.
pub fn settings(out: &mut Vec<u8>, settings: &[(u16, u32)]) {
    frame_head(out, 6 * settings.len(), SETTINGS, 0, 0);
    for (id, value) in settings {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&value.to_be_bytes());
    }
}

/// An HPACK integer with a `bits`-bit prefix, the first byte's other bits `first`.
pub fn integer(out: &mut Vec<u8>, bits: u32, first: u8, value: usize) {
    let max = (1usize << bits) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// An HPACK string literal, not Huffman-coded.
pub fn string(out: &mut Vec<u8>, text: &[u8]) {
    integer(out, 7, 0, text.len());
    out.extend_from_slice(text);
}

/// An HPACK literal field whose decoder is not to index it (`first` 0x00) or never to (0x10),
/// its name a static table index (`name` > 0) or, with `name` 0, the literal `name_text`.
pub fn literal(out: &mut Vec<u8>, first: u8, name: usize, name_text: &[u8], value: &[u8]) {
    integer(out, 4, first, name);
    if name == 0 {
        string(out, name_text);
    }
    string(out, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the load generator writes HPACK integers as the specification's own examples give
    /// them.
    #[test]
    fn integers_take_their_prefix_then_sevens() {
        // RFC 7541 appendix C.1: 10 and 1337 with a 5-bit prefix, 42 with an 8-bit one.
        let mut out = Vec::new();
        integer(&mut out, 5, 0, 10);
        assert_eq!(out, [10]);
        out.clear();
        integer(&mut out, 5, 0, 1337);
        assert_eq!(out, [31, 154, 10]);
        out.clear();
        integer(&mut out, 8, 0, 42);
        assert_eq!(out, [42]);
    }

    /// Goal: an HTTP/2 frame's padding is cut off, and a frame whose padding is longer than itself
    /// or lacks its pad length is refused.
    #[test]
    fn padding_is_cut_and_checked() {
        assert_eq!(unpadded(0, b"abc"), Some(&b"abc"[..]));
        assert_eq!(unpadded(PADDED, b"\x02abcxx"), Some(&b"abc"[..]));
        assert_eq!(unpadded(PADDED, b"\x05ab"), None);
        assert_eq!(unpadded(PADDED, b""), None);
    }

    /// Goal: an HTTP/2 frame is taken off the buffer only once it is whole, and one larger than the
    /// largest frame allowed is refused.
    #[test]
    fn frames_split_off_whole_or_not_at_all() {
        let mut out = Vec::new();
        frame_head(&mut out, 3, DATA, END_STREAM, 5);
        out.extend_from_slice(b"abc");
        assert!(next_frame(&out[..11], 100).unwrap().is_none());
        let frame = next_frame(&out, 100).unwrap().unwrap();
        assert_eq!(
            (frame.kind, frame.flags, frame.stream_id, frame.payload),
            (DATA, END_STREAM, 5, &b"abc"[..])
        );
        assert_eq!(frame.payload.len(), 3);
        assert_eq!(next_frame(&out, 2).err(), Some(3));
    }
}
