//! Speech-to-text by per-utterance file transcription, kind `openai_compatible`:
//! OpenAI's `POST /v1/audio/transcriptions`, and the self-hosted
//! servers that copy it (speaches / faster-whisper-server, whisper.cpp's `whisper-server`
//! started with `--inference-path /v1/audio/transcriptions`, vLLM, LocalAI). Nothing streams:
//! our own voice-activity detector ([`crate::audio::vad`], the same earshot model the call
//! uses) cuts the caller's audio into utterances (`endpointing_ms` of silence ends one, with
//! 300 ms of audio kept before the onset), each utterance is wrapped as a 16-bit PCM 8 kHz WAV
//! file and uploaded as `multipart/form-data` (`file`, `model`, `language`,
//! `response_format=json`), and the `text` of the answer becomes a final transcript. Uploads
//! run one at a time in order. A final is marked `speech_final` only when the caller is silent
//! and no other utterance is still being transcribed, so a pause mid-sentence never commits
//! half a turn. `Finalize` cuts the utterance in progress at once. Whisper invents words
//! ("you", "thank you") for near-silence, so utterances under [`MIN_SPEECH_MS`] of speech are
//! never uploaded. An HTTP error fails that utterance only (a non-fatal error saying what to
//! check); 401/403/404 are fatal because every later upload would fail the same way.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;

use super::error::SetupError;
use super::openai::{describe_reqwest, error_text};
use super::{SttContext, SttEvent, SttInput, SttProvider, SttStream};
use crate::audio::g711::ulaw_to_linear;
use crate::audio::vad::{Vad, VadConfig, VadEvent};
use crate::config::schema::SttConfig;
use crate::util::TaskGuard;

/// Audio kept before the detector's onset (its start decision lags the first syllable).
const PREROLL_MS: u64 = 300;
/// Utterances with less speech than this are not uploaded (Whisper hallucinates on them).
pub(crate) const MIN_SPEECH_MS: u64 = 120;
/// The longest utterance uploaded as one file; a longer one is cut and sent in parts.
const MAX_UTTERANCE_MS: u64 = 30_000;
/// Longest wait for one transcription.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// After `Close`, how long the last utterances may take.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Input queue: about 20 s of 20 ms carrier frames.
const INPUT_QUEUE: usize = 1024;
/// μ-law bytes per millisecond at 8 kHz.
const BYTES_PER_MS: u64 = 8;

pub(crate) struct OpenAiFileStt {
    cfg: SttConfig,
    client: reqwest::Client,
    url: String,
}

impl OpenAiFileStt {
    pub(crate) fn new(cfg: &SttConfig) -> Result<Self, SetupError> {
        crate::util::init_tls();
        let base = cfg.effective_base_url().trim().trim_end_matches('/');
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(SetupError::SttBaseUrl(base.to_string()));
        }
        // No redirects: the bearer key would follow them to another host.
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .map_err(SetupError::Client)?;
        Ok(Self {
            cfg: cfg.clone(),
            client,
            url: format!("{base}/audio/transcriptions"),
        })
    }
}

impl SttProvider for OpenAiFileStt {
    fn endpointing_ms(&self) -> u64 {
        u64::from(self.cfg.endpointing_ms)
    }

    fn open(&self, ctx: &SttContext) -> SttStream {
        let (in_tx, in_rx) = mpsc::channel(INPUT_QUEUE);
        let (ev_tx, ev_rx) = mpsc::channel(64);
        let uploader = Uploader {
            client: self.client.clone(),
            url: self.url.clone(),
            api_key: self.cfg.api_key.expose().to_string(),
            model: self.cfg.effective_model().to_string(),
            language: self.cfg.language.clone(),
            call_id: ctx.call_id.clone(),
        };
        let cutter = Cutter::new(u64::from(self.cfg.endpointing_ms));
        let task = tokio::spawn(async move {
            run(in_rx, &ev_tx, cutter, uploader).await;
            let _ = ev_tx.send(SttEvent::Closed).await;
        });
        SttStream {
            input: in_tx,
            events: ev_rx,
            guard: TaskGuard::new(task),
        }
    }
}

// ---------------------------------------------------------------- cutting utterances

/// An utterance ready to transcribe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Utterance {
    /// μ-law 8 kHz.
    pub ulaw: Vec<u8>,
    /// Cut by our `Finalize` rather than by silence.
    pub from_finalize: bool,
    /// How much of it the voice-activity detector heard as speech (ms).
    pub voiced_ms: u64,
}

/// Cuts caller audio into utterances with the voice-activity detector. Pure (no I/O), so it
/// is unit-tested on its own.
pub(crate) struct Cutter {
    vad: Vad,
    /// Audio since `buf_start_ms` (μ-law).
    buf: VecDeque<u8>,
    buf_start_ms: u64,
    /// Audio pushed so far, in ms.
    total_ms_x8: u64,
    /// Onset (audio ms) of the utterance in progress.
    onset: Option<u64>,
    /// Voiced audio seen in the utterance in progress (detector runs).
    voiced_ms: u64,
}

impl Cutter {
    pub(crate) fn new(silence_ms: u64) -> Self {
        Self {
            vad: Vad::new(VadConfig {
                stop_ms: silence_ms.max(32),
                ..VadConfig::default()
            }),
            buf: VecDeque::new(),
            buf_start_ms: 0,
            total_ms_x8: 0,
            onset: None,
            voiced_ms: 0,
        }
    }

    /// True while the caller is speaking.
    pub(crate) fn speaking(&self) -> bool {
        self.onset.is_some()
    }

    /// Feeds caller audio; returns the utterances it completed.
    pub(crate) fn push(&mut self, ulaw: &[u8]) -> Vec<Utterance> {
        self.buf.extend(ulaw.iter().copied());
        self.total_ms_x8 += ulaw.len() as u64;
        let mut out = Vec::new();
        for ev in self.vad.push_ulaw(ulaw) {
            match ev {
                VadEvent::SpeechStart { onset_ms } => {
                    self.onset = Some(onset_ms);
                    self.voiced_ms = 0;
                }
                VadEvent::SpeechEnd {
                    onset_ms,
                    last_voiced_ms,
                } => {
                    self.voiced_ms += last_voiced_ms.saturating_sub(onset_ms);
                    if let Some(u) = self.cut(false) {
                        out.push(u);
                    }
                }
            }
        }
        if let Some(onset) = self.onset
            && self.now_ms().saturating_sub(onset) >= MAX_UTTERANCE_MS
        {
            // Too long for one file: send this part, keep listening to the rest.
            self.voiced_ms = MIN_SPEECH_MS;
            if let Some(u) = self.cut(false) {
                out.push(u);
            }
            self.onset = Some(self.now_ms());
        }
        if self.onset.is_none() {
            self.trim_to(self.now_ms().saturating_sub(PREROLL_MS));
        }
        out
    }

    /// Our endpointer is sure the caller stopped: the utterance in progress, if any, now.
    pub(crate) fn finalize(&mut self) -> Option<Utterance> {
        let onset = self.onset?;
        self.voiced_ms += self.now_ms().saturating_sub(onset);
        let u = self.cut(true);
        // The detector may still be in speech; what follows is a new utterance.
        self.onset = self.vad.is_speaking().then(|| self.now_ms());
        u
    }

    fn now_ms(&self) -> u64 {
        self.total_ms_x8 / BYTES_PER_MS
    }

    /// Takes the utterance from its pre-roll to now; `None` when it is too short to upload.
    fn cut(&mut self, from_finalize: bool) -> Option<Utterance> {
        let onset = self.onset.take()?;
        let voiced = std::mem::take(&mut self.voiced_ms);
        let from = onset.saturating_sub(PREROLL_MS).max(self.buf_start_ms);
        self.trim_to(from);
        let ulaw: Vec<u8> = self.buf.drain(..).collect();
        self.buf_start_ms = self.now_ms();
        (voiced >= MIN_SPEECH_MS && !ulaw.is_empty()).then_some(Utterance {
            ulaw,
            from_finalize,
            voiced_ms: voiced,
        })
    }

    fn trim_to(&mut self, from_ms: u64) {
        if from_ms <= self.buf_start_ms {
            return;
        }
        let drop = ((from_ms - self.buf_start_ms) * BYTES_PER_MS).min(self.buf.len() as u64);
        self.buf.drain(..drop as usize);
        self.buf_start_ms = from_ms;
    }
}

/// μ-law 8 kHz as a 16-bit PCM mono 8 kHz WAV file (RIFF, 44-byte header).
pub fn wav_from_ulaw(ulaw: &[u8]) -> Vec<u8> {
    let data_len = (ulaw.len() * 2) as u32;
    let mut w = Vec::with_capacity(44 + data_len as usize);
    w.extend_from_slice(b"RIFF");
    w.extend_from_slice(&(36 + data_len).to_le_bytes());
    w.extend_from_slice(b"WAVEfmt ");
    w.extend_from_slice(&16u32.to_le_bytes());
    w.extend_from_slice(&1u16.to_le_bytes()); // PCM
    w.extend_from_slice(&1u16.to_le_bytes()); // mono
    w.extend_from_slice(&8000u32.to_le_bytes());
    w.extend_from_slice(&16000u32.to_le_bytes()); // byte rate
    w.extend_from_slice(&2u16.to_le_bytes()); // block align
    w.extend_from_slice(&16u16.to_le_bytes()); // bits
    w.extend_from_slice(b"data");
    w.extend_from_slice(&data_len.to_le_bytes());
    for &b in ulaw {
        w.extend_from_slice(&ulaw_to_linear(b).to_le_bytes());
    }
    w
}

// ---------------------------------------------------------------- uploading

/// Why one transcription failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TranscribeError {
    #[error("transcription request failed: {}", describe_reqwest(.0))]
    Request(#[source] reqwest::Error),
    #[error("no transcription within {0:?}")]
    Timeout(Duration),
    #[error("transcription server answered HTTP {status}: {message}{hint}")]
    Http {
        status: u16,
        message: String,
        hint: &'static str,
    },
    #[error("transcription server answered without a `text` field: {0}")]
    NoText(String),
}

impl TranscribeError {
    /// Errors every later upload would repeat: the session gives up.
    pub(crate) fn fatal(&self) -> bool {
        matches!(self, TranscribeError::Http { status, .. } if matches!(status, 401 | 403 | 404))
    }
}

/// What turns one cut utterance into text for [`run`]: the upload here, the in-process
/// decoder pool of `provider::whisper`.
pub(crate) trait Transcriber: Send + Sync + 'static {
    type Error: std::fmt::Display + Send + 'static;
    /// The utterance's text (empty: nothing worth keeping was said).
    fn transcribe(
        &self,
        u: &Utterance,
    ) -> impl std::future::Future<Output = Result<String, Self::Error>> + Send;
    /// Whether this failure ends the session (a chain then moves to its next STT).
    fn fatal(e: &Self::Error) -> bool;
    /// Hold each utterance's text until the session settles (nothing left to transcribe, the
    /// caller quiet) and send it as one final. For a transcriber slow enough that the call's
    /// `max_endpointing_ms` can pass while the second half of a sentence (cut at a pause) is
    /// still being transcribed: an early final with the first half would end the turn there.
    const SETTLE: bool = false;
    /// The call, for logs.
    fn call_id(&self) -> &str;
}

impl Transcriber for Uploader {
    type Error = TranscribeError;
    async fn transcribe(&self, u: &Utterance) -> Result<String, TranscribeError> {
        self.upload(&u.ulaw).await
    }
    fn fatal(e: &TranscribeError) -> bool {
        e.fatal()
    }
    fn call_id(&self) -> &str {
        &self.call_id
    }
}

fn http_hint(status: u16) -> &'static str {
    match status {
        401 | 403 => " (check [stt] api_key)",
        404 => " (check [stt] base_url: it must end in /v1 for OpenAI and speaches)",
        400 | 422 => " (check [stt] model and language)",
        429 => " (rate limited)",
        s if s >= 500 => " (server error; the utterance is lost)",
        _ => "",
    }
}

struct Uploader {
    client: reqwest::Client,
    url: String,
    api_key: String,
    model: String,
    language: String,
    call_id: String,
}

impl Uploader {
    async fn upload(&self, ulaw: &[u8]) -> Result<String, TranscribeError> {
        let mut nonce = [0u8; 16];
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce);
        let boundary = format!("patterd-{}", hex::encode(nonce));
        let body = multipart(
            &boundary,
            &[
                ("model", &self.model),
                ("language", &self.language),
                ("response_format", "json"),
            ],
            "utterance.wav",
            &wav_from_ulaw(ulaw),
        );
        let mut req = self
            .client
            .post(&self.url)
            .header(
                reqwest::header::CONTENT_TYPE,
                format!("multipart/form-data; boundary={boundary}"),
            )
            .header(reqwest::header::ACCEPT, "application/json")
            .body(body);
        if !self.api_key.is_empty() {
            req = req.bearer_auth(&self.api_key);
        }
        let send = async {
            let resp = req.send().await.map_err(TranscribeError::Request)?;
            let status = resp.status().as_u16();
            let bytes = resp.bytes().await.map_err(TranscribeError::Request)?;
            Ok::<_, TranscribeError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(REQUEST_TIMEOUT, send)
            .await
            .map_err(|_| TranscribeError::Timeout(REQUEST_TIMEOUT))??;
        if !(200..300).contains(&status) {
            return Err(TranscribeError::Http {
                status,
                message: error_text(&bytes),
                hint: http_hint(status),
            });
        }
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|_| TranscribeError::NoText(String::from_utf8_lossy(&bytes).into()))?;
        v.get("text")
            .and_then(Value::as_str)
            .map(|t| t.trim().to_string())
            .ok_or_else(|| TranscribeError::NoText(v.to_string()))
    }
}

/// A `multipart/form-data` body: text fields, then the file part.
pub fn multipart(boundary: &str, fields: &[(&str, &str)], filename: &str, file: &[u8]) -> Bytes {
    let mut b = Vec::with_capacity(file.len() + 512);
    for (name, value) in fields {
        b.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            )
            .as_bytes(),
        );
    }
    b.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\nContent-Type: audio/wav\r\n\r\n"
        )
        .as_bytes(),
    );
    b.extend_from_slice(file);
    b.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    Bytes::from(b)
}

// ---------------------------------------------------------------- the session

/// One transcription's outcome, with whether our `Finalize` cut it.
type Outcome<E> = (Result<String, E>, bool);

/// The session of a per-utterance STT: `cutter` cuts the caller's audio, `transcriber` turns
/// each utterance into a final, one at a time and in order (see the module's notes).
pub(crate) async fn run<T: Transcriber>(
    mut input: mpsc::Receiver<SttInput>,
    ev: &mpsc::Sender<SttEvent>,
    mut cutter: Cutter,
    transcriber: T,
) {
    if ev.send(SttEvent::Connected).await.is_err() {
        return;
    }
    // Transcriptions run one at a time, in order, on their own task.
    let (job_tx, mut job_rx) = mpsc::channel::<Utterance>(16);
    let (done_tx, mut done_rx) = mpsc::channel::<Outcome<T::Error>>(16);
    let worker = TaskGuard::new(tokio::spawn(async move {
        while let Some(u) = job_rx.recv().await {
            let r = transcriber.transcribe(&u).await;
            if let Err(e) = &r {
                tracing::info!(call = %transcriber.call_id(), error = %e, "transcription failed");
            }
            if done_tx.send((r, u.from_finalize)).await.is_err() {
                return;
            }
        }
    }));
    let mut pending = 0usize;
    // `SETTLE`: the texts transcribed since the last final, and whether one answered our
    // `Finalize`.
    let mut held: Option<(Vec<String>, bool)> = None;
    let mut closing: Option<tokio::time::Instant> = None;
    let mut job_tx = Some(job_tx);
    let enqueue = |u: Utterance, pending: &mut usize, job_tx: &Option<mpsc::Sender<_>>| {
        if let Some(tx) = job_tx
            && tx.try_send(u).is_ok()
        {
            *pending += 1;
        }
    };
    loop {
        // `SETTLE`: the held texts go out once nothing is left to transcribe and the caller
        // is quiet (or the session is closing).
        if pending == 0
            && (closing.is_some() || !cutter.speaking())
            && let Some((texts, from_finalize)) = held.take()
        {
            let done = SttEvent::Final {
                text: texts.join(" "),
                speech_final: !from_finalize,
                from_finalize,
            };
            if ev.send(done).await.is_err() {
                return;
            }
        }
        if closing.is_some() && pending == 0 {
            break;
        }
        let drain_at = closing.unwrap_or_else(tokio::time::Instant::now) + DRAIN_TIMEOUT;
        tokio::select! {
            msg = input.recv(), if closing.is_none() => match msg {
                Some(SttInput::Audio(b)) => {
                    for u in cutter.push(&b) {
                        enqueue(u, &mut pending, &job_tx);
                    }
                }
                Some(SttInput::Finalize) => match cutter.finalize() {
                    Some(u) => enqueue(u, &mut pending, &job_tx),
                    // The held texts answer the flush (sent at the top of the loop).
                    None if pending == 0 && held.is_some() => {
                        if let Some((_, from_finalize)) = held.as_mut() {
                            *from_finalize = true;
                        }
                    }
                    None if pending == 0 => {
                        // Nothing to transcribe: answer the flush at once, as Deepgram does.
                        let done = SttEvent::Final { text: String::new(), speech_final: false, from_finalize: true };
                        if ev.send(done).await.is_err() {
                            return;
                        }
                    }
                    None => {}
                },
                Some(SttInput::Close) | None => {
                    if let Some(u) = cutter.finalize() {
                        enqueue(u, &mut pending, &job_tx);
                    }
                    job_tx = None;
                    closing = Some(tokio::time::Instant::now());
                }
            },
            done = done_rx.recv() => {
                let Some((result, from_finalize)) = done else { break };
                pending = pending.saturating_sub(1);
                if T::SETTLE {
                    let (texts, ff) = held.get_or_insert_with(Default::default);
                    *ff |= from_finalize;
                    match result {
                        Ok(text) if !text.is_empty() => texts.push(text),
                        Ok(_) => {}
                        Err(e) => {
                            let fatal = T::fatal(&e);
                            if ev.send(SttEvent::Error { message: e.to_string(), fatal }).await.is_err() || fatal {
                                return;
                            }
                        }
                    }
                    continue;
                }
                // The turn may end here only if the caller is quiet and nothing else is coming.
                let last = pending == 0 && !cutter.speaking();
                let event = match result {
                    Ok(text) => SttEvent::Final { text, speech_final: last && !from_finalize, from_finalize },
                    Err(e) => {
                        let fatal = T::fatal(&e);
                        if ev.send(SttEvent::Error { message: e.to_string(), fatal }).await.is_err() || fatal {
                            return;
                        }
                        // The turn still ends: whatever else the caller said is kept.
                        SttEvent::Final { text: String::new(), speech_final: last && !from_finalize, from_finalize }
                    }
                };
                if ev.send(event).await.is_err() {
                    return;
                }
            }
            _ = tokio::time::sleep_until(drain_at), if closing.is_some() => {
                tracing::debug!("transcriptions still running at close; dropped");
                break;
            }
        }
    }
    drop(worker);
}

impl super::kinds::SttKindImpl for OpenAiFileStt {
    fn build(cfg: &SttConfig) -> Result<Self, SetupError> {
        Self::new(cfg)
    }
    fn credential_check(
        cfg: &SttConfig,
        client: &reqwest::Client,
    ) -> Option<reqwest::RequestBuilder> {
        Some(super::kinds::models_check(
            cfg.effective_base_url(),
            &cfg.api_key,
            client,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wav_header_is_pcm16_mono_8k() {
        let w = wav_from_ulaw(&[0xFF; 80]);
        assert_eq!(w.len(), 44 + 160);
        assert_eq!(&w[0..4], b"RIFF");
        assert_eq!(u32::from_le_bytes([w[4], w[5], w[6], w[7]]), 36 + 160);
        assert_eq!(&w[8..16], b"WAVEfmt ");
        assert_eq!(u16::from_le_bytes([w[20], w[21]]), 1);
        assert_eq!(u32::from_le_bytes([w[24], w[25], w[26], w[27]]), 8000);
        assert_eq!(u16::from_le_bytes([w[34], w[35]]), 16);
        assert_eq!(&w[36..40], b"data");
        // μ-law 0xFF is digital silence.
        assert!(w[44..].iter().all(|&b| b == 0));
    }

    #[test]
    fn multipart_has_fields_then_file() {
        let b = multipart("XYZ", &[("model", "m")], "u.wav", b"RIFF");
        let s = String::from_utf8_lossy(&b);
        assert!(s.starts_with(
            "--XYZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--XYZ\r\n"
        ));
        assert!(s.contains("name=\"file\"; filename=\"u.wav\"\r\nContent-Type: audio/wav\r\n\r\nRIFF\r\n--XYZ--\r\n"));
    }

    #[test]
    fn silence_and_tones_cut_nothing() {
        let mut c = Cutter::new(300);
        assert!(c.push(&vec![0xFF; 8000 * 3]).is_empty());
        assert!(!c.speaking());
        assert_eq!(c.finalize(), None);
        // The pre-roll bounds what is kept while nobody speaks.
        assert!(c.buf.len() <= (PREROLL_MS * BYTES_PER_MS) as usize);
    }

    fn clip(name: &str) -> Vec<u8> {
        let p = format!(
            "{}/tests/fixtures/speech/{name}.ulaw",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    #[test]
    fn speech_then_silence_is_one_utterance_with_its_preroll() {
        let speech = clip("book_table");
        let mut c = Cutter::new(300);
        let silence = vec![0xFF; 8000];
        let mut out = Vec::new();
        // 20 ms carrier frames, as a call delivers them.
        for frame in silence
            .chunks(160)
            .chain(speech.chunks(160))
            .chain(silence.chunks(160))
        {
            out.extend(c.push(frame));
        }
        assert_eq!(out.len(), 1, "one utterance");
        let u = &out[0];
        assert!(!u.from_finalize);
        // The whole clip, at most the pre-roll before it and the cutting silence after it.
        assert!(
            u.ulaw.len() >= speech.len() * 9 / 10,
            "{} of {}",
            u.ulaw.len(),
            speech.len()
        );
        assert!(
            u.ulaw.len() <= speech.len() + ((PREROLL_MS + 400) * BYTES_PER_MS) as usize,
            "{} of {}",
            u.ulaw.len(),
            speech.len()
        );
        assert!(!c.speaking());
    }

    #[test]
    fn finalize_cuts_the_utterance_in_progress() {
        let speech = clip("book_table");
        let mut c = Cutter::new(300);
        let half = &speech[..speech.len() / 2];
        assert!(c.push(half).is_empty());
        assert!(c.speaking());
        let u = c.finalize().expect("utterance");
        assert!(u.from_finalize);
        assert!(u.ulaw.len() >= half.len() / 2);
    }

    #[test]
    fn http_errors_say_what_to_check() {
        let e = TranscribeError::Http {
            status: 401,
            message: "Incorrect API key provided".into(),
            hint: http_hint(401),
        };
        assert!(e.fatal());
        assert!(e.to_string().contains("check [stt] api_key"), "{e}");
        let e = TranscribeError::Http {
            status: 500,
            message: "boom".into(),
            hint: http_hint(500),
        };
        assert!(!e.fatal());
    }
}
