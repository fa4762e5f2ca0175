//! Whole calls through the simulators, one binary: the carrier matrix (`carriers`, every
//! cross-carrier scenario over Twilio, Telnyx and Plivo), the Twilio-only scenarios
//! (`twilio`), an interrupted reply in each brain's wire format (`conversation`; the
//! conversation's timing runs on the paused clock in `src/call/driver/tests.rs`), faulty peers
//! during a call (`faults`), a forged-webhook flood during live calls (`flood`), callers that
//! send audio faster than real time (`media_flood`) and the
//! agent's tools during a call (`tools`), post-call webhooks and their outbox (`webhooks`), the
//! calls' OpenTelemetry traces (`telemetry`), and
//! the conversation scenario suite (`suite`).
//!
//! `cargo test --test calls conversation::` runs one module's tests.

#[path = "../common/mod.rs"]
mod common;

mod actions;
mod carriers;
mod conversation;
mod faults;
mod flood;
mod heard;
mod local_tts;
mod media_flood;
mod ops;
mod plivo_l16;
mod recording;
#[cfg(feature = "smart_turn")]
mod smart_turn;
#[cfg(feature = "smart_turn")]
mod smart_turn_reference;
mod stt_fallback;
mod stt_providers;
mod suite;
mod telemetry;
mod telnyx_plivo;
mod tools;
mod tts;
mod twilio;
mod web;
mod webhooks;
#[cfg(feature = "whisper")]
mod whisper;

/// The local speech-to-text tests live behind the feature; asked for without it, say so.
#[cfg(not(feature = "whisper"))]
#[test]
fn local_speech_tests_need_the_whisper_feature_when_required() {
    assert!(
        std::env::var("PATTERD_REQUIRE_LOCAL_SPEECH").as_deref() != Ok("1"),
        "PATTERD_REQUIRE_LOCAL_SPEECH=1, but this binary was built without --features whisper: \
         the local STT tests did not run"
    );
}
