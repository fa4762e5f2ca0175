//! Audio primitives for 8 kHz telephony: G.711 μ-law / A-law conversion (bit-exact with
//! CPython's `audioop`, which produced the test vectors), silence bytes, frame energy and tone
//! synthesis for simulators. No I/O and no state: every function is a pure transform.

pub mod g711;
