//! Audio primitives for 8 kHz telephony: G.711 μ-law / A-law conversion (bit-exact with
//! CPython's `audioop`, which produced the test vectors), silence bytes, frame energy and tone
//! synthesis for simulators, DTMF digits and their in-band tones ([`dtmf`]) (all pure
//! transforms), streaming band-limited resampling of PCM16 ([`resample`], for vendors that only
//! speak 16–48 kHz PCM), and per-call voice activity detection
//! ([`vad`], with its background-level tracker [`noise_floor`] and, behind the cargo feature
//! `silero`, the Silero network in `silero`), the pitch measure barge-in uses ([`pitch`]) and
//! the echo estimate that tells the agent's own voice coming back from the caller ([`echo`]),
//! and the answering machine's end-of-greeting beep ([`beep`]).

pub(crate) mod beep;
pub mod dtmf;
pub mod echo;
pub mod g711;
pub(crate) mod noise_floor;
pub mod pitch;
pub mod resample;
#[cfg(feature = "silero")]
pub mod silero;
pub mod vad;
pub mod wav;
#[cfg(feature = "smart_turn")]
pub mod whisper_mel;
