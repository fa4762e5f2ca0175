//! The W3C Trace Context `traceparent` header (version `00`): a trace id, the id of the span
//! a request belongs to and the sampled flag, as `00-<32 hex>-<16 hex>-<2 hex>`. patterd sends
//! it to the brain, to consults and to webhook tools when `[telemetry]` is on, so the peer's
//! own trace joins the call's ([`TraceParent::header_value`]; [`TRACEPARENT`] is the header's
//! name). A call's own span follows from its call id ([`TraceParent::for_call`]), so whatever
//! reports on a call later (a webhook delivery) can join its trace knowing only the id. [`TraceParent::child`] is the context of a new span under this one (a fresh random
//! span id), which is how a request made for a tool call carries that call's span. Plain data:
//! no tracer, no I/O.

use std::fmt;

/// The request header's name (lower case, as the specification writes it).
pub const TRACEPARENT: &str = "traceparent";

/// Domain separation of a call's trace ids ([`TraceParent::for_call`]).
const CALL_TRACE_LABEL: &str = "patterd call trace v1\n";

/// One span's context as a `traceparent` carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// 16 bytes, never all zero.
    pub trace_id: [u8; 16],
    /// 8 bytes, never all zero.
    pub span_id: [u8; 8],
    /// The `sampled` flag (bit 0 of the trace flags).
    pub sampled: bool,
}

impl TraceParent {
    /// A context; `None` when either id is all zero (the specification's invalid value).
    pub fn new(trace_id: [u8; 16], span_id: [u8; 8], sampled: bool) -> Option<Self> {
        (trace_id != [0; 16] && span_id != [0; 8]).then_some(Self {
            trace_id,
            span_id,
            sampled,
        })
    }

    /// The context of call `call_id`'s own span: trace and span ids taken from SHA-256 of a
    /// label and the call id, sampled. Anything that knows a call's id — a webhook delivered
    /// after the call, another instance of a cluster — names the same span without asking the
    /// call for it (call ids are unique: a call id is admitted once).
    pub fn for_call(call_id: &str) -> Self {
        let digest = ring::digest::digest(
            &ring::digest::SHA256,
            format!("{CALL_TRACE_LABEL}{call_id}").as_bytes(),
        );
        let d = digest.as_ref();
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        trace_id.copy_from_slice(&d[..16]);
        span_id.copy_from_slice(&d[16..24]);
        // An all-zero id has odds of 2^-64 at most; such a call gets a random trace instead.
        Self::new(trace_id, span_id, true).unwrap_or_else(Self::root)
    }

    /// A new trace: random trace and span ids, sampled.
    pub fn root() -> Self {
        Self {
            trace_id: random_id(),
            span_id: random_id(),
            sampled: true,
        }
    }

    /// The context of a new span under this one: the same trace and flags, a fresh span id.
    pub fn child(&self) -> Self {
        Self {
            span_id: random_id(),
            ..*self
        }
    }

    /// The header's value: `00-<trace id>-<span id>-<flags>`, lower-case hex.
    pub fn header_value(&self) -> String {
        self.to_string()
    }

    /// Reads a header value. Version `00` must be exactly 55 characters; a later version
    /// may carry more after its first four fields, which are read the same way (the
    /// specification's forward compatibility). Version `ff`, upper-case hex and all-zero ids
    /// are refused.
    pub fn parse(value: &str) -> Option<Self> {
        let v = value.trim();
        let mut parts = v.splitn(5, '-');
        let version = parts.next()?;
        let trace = parts.next()?;
        let span = parts.next()?;
        let flags = parts.next()?;
        let rest = parts.next();
        let lower_hex = |s: &str, n: usize| {
            s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        if !lower_hex(version, 2) || version == "ff" || !lower_hex(flags, 2) {
            return None;
        }
        if version == "00" && rest.is_some() {
            return None;
        }
        if !lower_hex(trace, 32) || !lower_hex(span, 16) {
            return None;
        }
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        hex::decode_to_slice(trace, &mut trace_id).ok()?;
        hex::decode_to_slice(span, &mut span_id).ok()?;
        let flags = u8::from_str_radix(flags, 16).ok()?;
        Self::new(trace_id, span_id, flags & 1 == 1)
    }

    /// The trace id as 32 lower-case hex characters.
    pub fn trace_hex(&self) -> String {
        hex::encode(self.trace_id)
    }

    /// The span id as 16 lower-case hex characters.
    pub fn span_hex(&self) -> String {
        hex::encode(self.span_id)
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            self.trace_hex(),
            self.span_hex(),
            u8::from(self.sampled)
        )
    }
}

/// A random id that is not all zero (the system's random source; a failure, which does not
/// happen on Linux, falls back to the clock and a counter, still never zero).
fn random_id<const N: usize>() -> [u8; N] {
    use ring::rand::SecureRandom;
    let rng = ring::rand::SystemRandom::new();
    let mut id = [0u8; N];
    loop {
        if rng.fill(&mut id).is_err() {
            fallback_fill(&mut id);
        }
        if id != [0u8; N] {
            return id;
        }
    }
}

fn fallback_fill(id: &mut [u8]) {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(1);
    for chunk in id.chunks_mut(8) {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        let bytes = h.finish().to_be_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_specification_example_round_trips() {
        let tp = TraceParent::parse(EXAMPLE).expect("valid");
        assert_eq!(tp.trace_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(tp.span_hex(), "00f067aa0ba902b7");
        assert!(tp.sampled);
        assert_eq!(tp.header_value(), EXAMPLE);
        let unsampled = TraceParent::parse(&EXAMPLE.replace("-01", "-00")).expect("valid");
        assert!(!unsampled.sampled);
        assert!(unsampled.header_value().ends_with("-00"));
    }

    #[test]
    fn malformed_values_are_refused() {
        for bad in [
            "",
            "00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            // Upper case, wrong lengths, all-zero ids, version ff, junk after version 00.
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
        // A later version may carry more fields; its first four are read.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert!(TraceParent::parse(later).is_some());
    }

    #[test]
    fn a_call_s_context_follows_from_its_id_alone() {
        let a = TraceParent::for_call("CA0123");
        assert_eq!(a, TraceParent::for_call("CA0123"));
        assert_ne!(a.trace_id, TraceParent::for_call("CA0124").trace_id);
        assert!(a.sampled);
        assert_eq!(TraceParent::parse(&a.header_value()), Some(a));
    }

    #[test]
    fn a_child_keeps_the_trace_and_gets_a_new_span() {
        let root = TraceParent::root();
        let child = root.child();
        assert_eq!(child.trace_id, root.trace_id);
        assert_ne!(child.span_id, root.span_id);
        assert_ne!(child.span_id, [0; 8]);
        assert!(child.sampled);
        assert_eq!(TraceParent::parse(&child.header_value()), Some(child));
        assert_ne!(TraceParent::root().trace_id, root.trace_id);
        assert_eq!(TraceParent::new([0; 16], [1; 8], true), None);
    }
}
