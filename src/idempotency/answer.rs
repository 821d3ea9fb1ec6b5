//! A kept response and its encoding: what a [`Record`](super::Record)'s `answer` holds.
//!
//! The layout, all integers big-endian:
//!
//! ```text
//! "TLA1"                          magic and version
//! [u8; 32]                        the request's fingerprint
//! u16                             status
//! u16 n, n × (u16 len, name, u32 len, value)   headers
//! u32 len, body
//! u8 0 | 1, then headers as above when 1       trailers
//! ```

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};

/// The first bytes of every encoded answer: a format of another version is never misread.
const MAGIC: &[u8; 4] = b"TLA1";

/// A SHA-256 over what makes two requests the same (see `Fingerprint`).
pub(crate) type Digest = [u8; 32];

/// A response as it is kept and replayed.
#[derive(Debug, PartialEq)]
pub(crate) struct Answer {
    pub(crate) fingerprint: Digest,
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    pub(crate) trailers: Option<HeaderMap>,
}

/// Headers of a response that are never kept: those of one connection or one message
/// (`connection` and the headers it lists are hop-by-hop; `content-length` is set again from
/// the kept body), the time of the first response (`date`), and cookies (`set-cookie`: a
/// session handed out once is not handed out again).
pub(crate) fn is_kept(name: &HeaderName) -> bool {
    !matches!(
        *name,
        header::CONNECTION
            | header::TRANSFER_ENCODING
            | header::UPGRADE
            | header::TE
            | header::TRAILER
            | header::PROXY_AUTHENTICATE
            | header::CONTENT_LENGTH
            | header::DATE
            | header::SET_COOKIE
    ) && name.as_str() != "keep-alive"
        && name.as_str() != "proxy-connection"
}

impl Answer {
    /// The encoded answer.
    pub(crate) fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(64 + self.body.len());
        out.put_slice(MAGIC);
        out.put_slice(&self.fingerprint);
        out.put_u16(self.status.as_u16());
        put_headers(&mut out, &self.headers);
        out.put_u32(len32(self.body.len()));
        out.put_slice(&self.body);
        match &self.trailers {
            None => out.put_u8(0),
            Some(trailers) => {
                out.put_u8(1);
                put_headers(&mut out, trailers);
            }
        }
        out.freeze()
    }

    /// The answer `bytes` encode; `None` when they are not an answer of this format.
    pub(crate) fn decode(bytes: &Bytes) -> Option<Self> {
        let mut reader = Reader { bytes, at: 0 };
        if reader.take(4)? != MAGIC {
            return None;
        }
        let fingerprint = reader.take(32)?.try_into().ok()?;
        let status = StatusCode::from_u16(reader.u16()?).ok()?;
        let headers = reader.headers()?;
        let len = reader.u32()?;
        let body = reader.slice(len)?;
        let trailers = match reader.take(1)? {
            [0] => None,
            [1] => Some(reader.headers()?),
            _ => return None,
        };
        (reader.at == bytes.len()).then_some(Self { fingerprint, status, headers, body, trailers })
    }
}

/// A length that fits a `u32`: header values and bodies kept are bounded far below it by the
/// layer's limits; a larger one is cut to `u32::MAX` (and the answer then fails to decode, so
/// it is never replayed).
fn len32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

fn put_headers(out: &mut BytesMut, headers: &HeaderMap) {
    let count = u16::try_from(headers.len()).unwrap_or(u16::MAX);
    out.put_u16(count);
    for (name, value) in headers.iter().take(usize::from(count)) {
        // Header names are at most 64 KiB in `http`.
        out.put_u16(u16::try_from(name.as_str().len()).unwrap_or(u16::MAX));
        out.put_slice(name.as_str().as_bytes());
        out.put_u32(len32(value.len()));
        out.put_slice(value.as_bytes());
    }
}

struct Reader<'a> {
    bytes: &'a Bytes,
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.at.checked_add(n)?;
        let taken = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(taken)
    }

    fn slice(&mut self, n: u32) -> Option<Bytes> {
        let n = usize::try_from(n).ok()?;
        let end = self.at.checked_add(n)?;
        if end > self.bytes.len() {
            return None;
        }
        let slice = self.bytes.slice(self.at..end);
        self.at = end;
        Some(slice)
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }

    fn headers(&mut self) -> Option<HeaderMap> {
        let count = self.u16()?;
        let mut headers = HeaderMap::with_capacity(usize::from(count));
        for _ in 0..count {
            let len = self.u16()?;
            let name = HeaderName::from_bytes(self.take(usize::from(len))?).ok()?;
            let len = self.u32()?;
            let value = HeaderValue::from_maybe_shared(self.slice(len)?).ok()?;
            headers.append(name, value);
        }
        Some(headers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(trailers: bool) -> Answer {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.append("x-charge", HeaderValue::from_static("1"));
        headers.append("x-charge", HeaderValue::from_static("2"));
        let trailers = trailers.then(|| {
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            trailers
        });
        Answer {
            fingerprint: [7; 32],
            status: StatusCode::CREATED,
            headers,
            body: Bytes::from_static(b"{\"charge\":\"ch_1\"}"),
            trailers,
        }
    }

    /// Encoding round-trips every part, repeated headers and trailers included.
    #[test]
    fn round_trip() {
        for trailers in [false, true] {
            let answer = answer(trailers);
            assert_eq!(Answer::decode(&answer.encode()), Some(answer));
        }
    }

    /// Truncated, extended or foreign bytes are not an answer.
    #[test]
    fn refuses_what_it_did_not_write() {
        let encoded = answer(true).encode();
        for cut in 0..encoded.len() {
            assert_eq!(Answer::decode(&encoded.slice(..cut)), None, "cut at {cut}");
        }
        let mut longer = encoded.to_vec();
        longer.push(0);
        assert_eq!(Answer::decode(&Bytes::from(longer)), None);
        assert_eq!(Answer::decode(&Bytes::from_static(b"TLA2")), None);
    }

    /// Connection-level headers, `date` and cookies are not kept; the others are.
    #[test]
    fn kept_headers() {
        for dropped in [
            "connection",
            "keep-alive",
            "transfer-encoding",
            "content-length",
            "date",
            "set-cookie",
        ] {
            assert!(!is_kept(&HeaderName::from_static(dropped)), "{dropped}");
        }
        for kept in ["content-type", "location", "etag", "grpc-status", "x-charge-id"] {
            assert!(is_kept(&HeaderName::from_static(kept)), "{kept}");
        }
    }
}
