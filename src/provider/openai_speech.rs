//! OpenAI-style speech synthesis: one `POST {base_url}/audio/speech`
//! per text piece with `response_format = "pcm"`, whose chunked body is raw 16-bit
//! little-endian mono PCM (24 kHz from OpenAI and Kokoro-FastAPI; speaches sends the
//! `sample_rate` it was asked for). The PCM goes through [`crate::audio::resample`] (a
//! band-limited FFT resampler, state kept across body chunks, a sample split between two
//! chunks joined) to 8 kHz and is μ-law encoded for the carrier.
//!
//! Kind `openai` sends `Authorization: Bearer` and may carry `instructions`; kind
//! `openai_compatible` (self-hosted Kokoro-FastAPI / speaches) sends the key only when one is
//! set and asks for `sample_rate` only when configured. Barge-in cancels by dropping the
//! request, as for ElevenLabs' HTTP stream.

use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;

use super::elevenlabs::MAX_AUDIO_BYTES;
use super::error::{SetupError, TtsError};
use super::openai::error_text;
use super::{TtsEvent, TtsProvider, TtsStream};
use crate::audio::g711::encode_ulaw;
use crate::audio::resample::Resampler;
use crate::config::schema::{TtsConfig, TtsKind};

/// The PCM rate of `response_format = "pcm"` when none is asked for (OpenAI, Kokoro).
pub(crate) const DEFAULT_PCM_RATE: u32 = 24_000;

/// Default longest wait for the response head or the next body chunk.
const DEFAULT_STALL: Duration = Duration::from_secs(10);

pub struct OpenAiSpeech {
    cfg: TtsConfig,
    client: reqwest::Client,
    url: String,
    vendor: &'static str,
    pcm_rate: u32,
    stall: Duration,
}

impl OpenAiSpeech {
    pub fn new(cfg: &TtsConfig) -> Result<Self, SetupError> {
        crate::util::init_tls();
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .map_err(SetupError::Client)?;
        let pcm_rate = match cfg.kind {
            TtsKind::OpenaiCompatible => cfg.sample_rate.unwrap_or(DEFAULT_PCM_RATE),
            _ => DEFAULT_PCM_RATE,
        };
        // Fails here (at start-up) rather than per sentence when the rate cannot be resampled.
        Resampler::new(pcm_rate, 8000).map_err(SetupError::Resampler)?;
        Ok(Self {
            cfg: cfg.clone(),
            client,
            url: format!("{}/audio/speech", cfg.base_url.trim_end_matches('/')),
            vendor: match cfg.kind {
                TtsKind::Openai => "OpenAI speech",
                _ => "OpenAI-compatible speech server",
            },
            pcm_rate,
            stall: DEFAULT_STALL,
        })
    }

    /// The request body for `text` (OpenAI's fields; `sample_rate` is speaches' own).
    pub fn body(&self, text: &str) -> serde_json::Value {
        let mut body = json!({
            "model": self.cfg.model,
            "input": text,
            "voice": self.cfg.voice_id,
            "response_format": "pcm",
        });
        if let Some(speed) = self.cfg.speed {
            body["speed"] = json!(speed);
        }
        match self.cfg.kind {
            TtsKind::Openai => {
                if let Some(i) = self.cfg.instructions.as_deref().filter(|i| !i.is_empty()) {
                    body["instructions"] = json!(i);
                }
            }
            _ => {
                if let Some(r) = self.cfg.sample_rate {
                    body["sample_rate"] = json!(r);
                }
            }
        }
        body
    }
}

impl TtsProvider for OpenAiSpeech {
    fn synthesize(&self, text: &str) -> TtsStream {
        let mut req = self.client.post(&self.url).json(&self.body(text));
        if !self.cfg.api_key.is_empty() {
            req = req.bearer_auth(self.cfg.api_key.expose());
        }
        let (stall, vendor, rate) = (self.stall, self.vendor, self.pcm_rate);
        TtsStream::spawn(move |tx| async move { run(req, stall, vendor, rate, &tx).await })
    }
}

async fn run(
    req: reqwest::RequestBuilder,
    stall: Duration,
    vendor: &'static str,
    rate: u32,
    tx: &mpsc::Sender<TtsEvent>,
) -> Result<(), TtsError> {
    let mut resp = tokio::time::timeout(stall, req.send())
        .await
        .map_err(|_| TtsError::NoAnswer {
            vendor,
            after: stall,
        })?
        .map_err(|source| TtsError::Request { vendor, source })?;
    let status = resp.status();
    let ctype = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    // Raw PCM comes as `audio/pcm` (OpenAI, Kokoro, speaches); some proxies relabel it as
    // octet-stream. JSON or text with a 200 is an error page, never audio.
    let audio = ctype.starts_with("audio/") || ctype.starts_with("application/octet-stream");
    if status != reqwest::StatusCode::OK || !audio {
        let mut body = Vec::new();
        while body.len() < 16 * 1024 {
            match tokio::time::timeout(Duration::from_secs(5), resp.chunk()).await {
                Ok(Ok(Some(c))) => body.extend_from_slice(&c),
                _ => break,
            }
        }
        let hint = match status.as_u16() {
            401 => " (check [tts] api_key)",
            404 => " (check [tts] base_url: it ends with /v1)",
            422 | 400 => " (check [tts] model and voice_id)",
            429 => " (rate limited or out of quota)",
            _ => "",
        };
        return Err(TtsError::Http {
            vendor,
            status: status.as_u16(),
            content_type: if ctype.is_empty() {
                "no content type".to_string()
            } else {
                ctype
            },
            message: error_text(&body),
            hint,
        });
    }
    let mut resampler = Resampler::new(rate, 8000).map_err(|e| TtsError::Reported {
        vendor,
        message: e.to_string(),
        status: None,
    })?;
    let mut pcm8k = Vec::new();
    let mut received = 0usize;
    loop {
        let chunk = tokio::time::timeout(stall, resp.chunk())
            .await
            .map_err(|_| TtsError::Stalled {
                vendor,
                after: stall,
            })?
            .map_err(|source| TtsError::Stream { vendor, source })?;
        pcm8k.clear();
        let end = match chunk {
            Some(c) => {
                resampler.push_le_bytes(&c, &mut pcm8k);
                false
            }
            None => {
                resampler.finish(&mut pcm8k);
                true
            }
        };
        if !pcm8k.is_empty() {
            received += pcm8k.len();
            if received > MAX_AUDIO_BYTES {
                return Err(TtsError::TooMuchAudio {
                    vendor,
                    limit: MAX_AUDIO_BYTES,
                });
            }
            tx.send(TtsEvent::Audio(encode_ulaw(&pcm8k).into()))
                .await
                .map_err(|_| TtsError::Abandoned)?;
        }
        if end {
            return Ok(());
        }
    }
}

impl super::kinds::TtsKindImpl for OpenAiSpeech {
    fn build(cfg: &TtsConfig) -> Result<Self, SetupError> {
        Self::new(cfg)
    }
    fn credential_check(
        cfg: &TtsConfig,
        client: &reqwest::Client,
    ) -> Option<reqwest::RequestBuilder> {
        Some(super::kinds::models_check(
            &cfg.base_url,
            &cfg.api_key,
            client,
        ))
    }
}
