//! Audio primitives for 8 kHz telephony: G.711 μ-law / A-law conversion (bit-exact with
//! CPython's `audioop`, which produced the test vectors), silence bytes, frame energy and tone
//! synthesis for simulators, DTMF digits and their in-band tones ([`dtmf`]) (all pure
//! transforms), and per-call voice activity detection
//! ([`vad`], the only stateful piece).

pub mod dtmf;
pub mod g711;
pub mod vad;
pub mod wav;
