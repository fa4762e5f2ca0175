//! The browser phone's socket protocol: JSON text frames, audio as base64 μ-law 8 kHz in
//! 20 ms frames (20 to 60 ms accepted, see [`AUDIO_BYTES`]) — the same bytes a phone call carries, so nothing is resampled on the server
//! (the page runs its AudioContext at 8 kHz and the browser's own resampler converts the
//! microphone). Page → daemon: `{"event":"start"}`, `{"event":"media","payload":…}`,
//! `{"event":"mark","name":…}` (sent when the audio before the mark has really been played,
//! or dropped by a clear), `{"event":"dtmf","digit":…}`, `{"event":"stop"}`. Daemon → page:
//! `media`, `mark`, `clear`, and `progress` (what is new of the call's transcript entries and
//! timeline events, for the page to show: a caller sees the transcript, the agent's state
//! and the turn latencies; the whole timeline only with the API token, [`ProgressView`]).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde_json::{Value, json};

use crate::carrier::codec_util::{json_frame, parse_digit, str_field, unknown_event};
use crate::carrier::{
    CallProgress, CodecError, MAX_MEDIA_MESSAGE, MediaCodec, MediaCommand, MediaEvent,
    ProgressView, StreamStart,
};

/// The audio one `media` frame may carry: 20 to 60 ms of μ-law 8 kHz (the page sends 20 ms).
/// Anything else is refused before it is decoded, counted as a malformed frame, never
/// buffered: a page that sends seconds a frame is not a microphone.
pub(crate) const AUDIO_BYTES: std::ops::RangeInclusive<usize> = 160..=480;

/// Per-socket codec; the call id is known before the socket opens (the route admitted it).
#[derive(Debug, Clone)]
pub(crate) struct WebCodec {
    call_id: String,
    view: ProgressView,
}

impl WebCodec {
    /// The codec of call `call_id`, whose page may see `view` of its progress.
    pub(crate) fn new(call_id: &str, view: ProgressView) -> Self {
        Self {
            call_id: call_id.to_string(),
            view,
        }
    }
}

impl MediaCodec for WebCodec {
    fn decode(&mut self, frame: &str) -> Result<Option<MediaEvent>, CodecError> {
        let msg = json_frame(frame, MAX_MEDIA_MESSAGE)?;
        match str_field(&msg, "event")? {
            "start" => Ok(Some(MediaEvent::Start(StreamStart {
                call_id: self.call_id.clone(),
                stream_id: self.call_id.clone(),
                custom_parameters: Default::default(),
            }))),
            "media" => {
                let payload = str_field(&msg, "payload")?;
                // The decoded size, from the base64 length (up to two bytes of padding).
                let most = payload.len() / 4 * 3;
                if most > *AUDIO_BYTES.end() + 2 || most < *AUDIO_BYTES.start() {
                    return Err(CodecError::AudioFrameSize(most));
                }
                let audio = STANDARD
                    .decode(payload)
                    .map_err(|_| CodecError::BadBase64)?;
                if !AUDIO_BYTES.contains(&audio.len()) {
                    return Err(CodecError::AudioFrameSize(audio.len()));
                }
                Ok(Some(MediaEvent::Audio(Bytes::from(audio))))
            }
            "mark" => Ok(Some(MediaEvent::MarkPlayed(
                str_field(&msg, "name")?.to_string(),
            ))),
            "dtmf" => Ok(Some(MediaEvent::Dtmf(parse_digit(str_field(
                &msg, "digit",
            )?)?))),
            "stop" => Ok(Some(MediaEvent::Stop)),
            other => Err(unknown_event(other)),
        }
    }

    fn encode(&mut self, cmd: &MediaCommand) -> Option<String> {
        let v = match cmd {
            MediaCommand::Audio(a) => json!({"event": "media", "payload": STANDARD.encode(a)}),
            MediaCommand::Mark(name) => json!({"event": "mark", "name": name}),
            MediaCommand::Clear => json!({"event": "clear"}),
        };
        Some(v.to_string())
    }

    /// A closed page is the caller hanging up.
    fn stop_on_close(&self) -> bool {
        true
    }

    fn wants_progress(&self) -> bool {
        true
    }

    fn progress_view(&self) -> ProgressView {
        self.view
    }

    fn encode_progress(&mut self, p: &CallProgress) -> Option<String> {
        let v: Value = match p {
            CallProgress::Event { t_ms, kind, detail } => json!({
                "event": "progress", "type": "event", "t_ms": t_ms, "kind": kind, "detail": detail,
            }),
            CallProgress::Transcript {
                index,
                agent,
                text,
                heard,
                interrupted,
            } => json!({
                "event": "progress", "type": "transcript", "index": index,
                "speaker": if *agent { "agent" } else { "caller" },
                "text": text, "heard": heard, "interrupted": interrupted,
            }),
        };
        Some(v.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_decode_to_the_call_the_route_admitted() {
        let mut c = WebCodec::new("web-1", ProgressView::Caller);
        match c.decode(r#"{"event":"start"}"#) {
            Ok(Some(MediaEvent::Start(s))) => assert_eq!(s.call_id, "web-1"),
            other => panic!("{other:?}"),
        }
        let audio = STANDARD.encode([0xFFu8; 160]);
        assert_eq!(
            c.decode(&format!(r#"{{"event":"media","payload":"{audio}"}}"#)),
            Ok(Some(MediaEvent::Audio(Bytes::from(vec![0xFF; 160]))))
        );
        assert_eq!(
            c.decode(r#"{"event":"mark","name":"m1"}"#),
            Ok(Some(MediaEvent::MarkPlayed("m1".into())))
        );
        assert_eq!(
            c.decode(r#"{"event":"dtmf","digit":"5"}"#),
            Ok(Some(MediaEvent::Dtmf('5')))
        );
        assert_eq!(c.decode(r#"{"event":"stop"}"#), Ok(Some(MediaEvent::Stop)));
    }

    #[test]
    fn bad_frames_are_refused_with_why() {
        let mut c = WebCodec::new("web-1", ProgressView::Caller);
        assert!(matches!(c.decode("nope"), Err(CodecError::BadJson(_))));
        assert_eq!(
            c.decode(r#"{"event":"media"}"#),
            Err(CodecError::MissingField("payload"))
        );
        let bad = "!".repeat(216);
        assert_eq!(
            c.decode(&format!(r#"{{"event":"media","payload":"{bad}"}}"#)),
            Err(CodecError::BadBase64)
        );
        let big = "A".repeat(20_000);
        assert!(matches!(
            c.decode(&format!(r#"{{"event":"media","payload":"{big}"}}"#)),
            Err(CodecError::AudioFrameSize(_))
        ));
        assert!(matches!(
            c.decode(r#"{"event":"hello"}"#),
            Err(CodecError::UnknownEvent(_))
        ));
        assert_eq!(
            c.decode(r#"{"event":"dtmf","digit":"55"}"#),
            Err(CodecError::InvalidField("digit"))
        );
    }

    /// A frame carries 20 to 60 ms of audio: 160 to 480 bytes; a second (the 8,000-byte
    /// frames of a flood) or a few bytes are refused.
    #[test]
    fn audio_frames_are_20_to_60_ms() {
        let mut c = WebCodec::new("web-1", ProgressView::Caller);
        let frame = |n: usize| {
            let audio = STANDARD.encode(vec![0xFFu8; n]);
            format!(r#"{{"event":"media","payload":"{audio}"}}"#)
        };
        for n in [160, 161, 320, 479, 480] {
            match c.decode(&frame(n)) {
                Ok(Some(MediaEvent::Audio(a))) => assert_eq!(a.len(), n),
                other => panic!("{n} bytes: {other:?}"),
            }
        }
        for n in [0, 1, 80, 159, 481, 482, 483, 640, 8000] {
            assert!(
                matches!(c.decode(&frame(n)), Err(CodecError::AudioFrameSize(_))),
                "{n} bytes accepted"
            );
        }
    }

    #[test]
    fn commands_and_progress_encode() {
        let mut c = WebCodec::new("web-1", ProgressView::Caller);
        assert_eq!(
            c.encode(&MediaCommand::Clear).as_deref(),
            Some(r#"{"event":"clear"}"#)
        );
        let p = c
            .encode_progress(&CallProgress::Transcript {
                index: 0,
                agent: true,
                text: "Hi".into(),
                heard: "Hi".into(),
                interrupted: false,
            })
            .expect("frame");
        let v: Value = serde_json::from_str(&p).expect("json");
        assert_eq!(v["speaker"], "agent");
        assert_eq!(v["type"], "transcript");
    }
}
