//! `[tts.NAME] kind = "piper"`: a Piper voice (VITS, ONNX) run inside patterd (cargo feature
//! `piper`). Each sentence is cut into pieces at its clauses (`local_tts::pieces`); each piece
//! is phonemized by a long-lived `espeak-ng` process ([`espeak`]), mapped to the voice's ids
//! ([`voice`]) and run through onnxruntime (`engine`, the library shared with Smart Turn,
//! `util::onnxruntime`), on the blocking pool and at most `workers` pieces at once over every
//! call (one loaded voice per worker). The float PCM at the voice's rate (22.05 kHz for
//! `en_US-joe-medium`) is peak-normalised as Piper does, resampled to μ-law 8 kHz
//! (`audio::resample`) and sent piece by piece, so the first audio waits for the first clause
//! only; each piece's word timings are estimated from its words' phoneme counts over its voiced
//! audio, so an interrupted reply keeps the words the caller heard. Built without the feature,
//! the kind is refused when the configuration loads.

#[cfg(feature = "piper")]
mod engine;
#[cfg(feature = "piper")]
pub(crate) mod espeak;
#[cfg(feature = "piper")]
pub(crate) mod voice;

use super::error::SetupError;
use super::{TtsProvider, TtsStream};
use crate::config::schema::TtsConfig;

/// A Piper voice, shared by every call (and by a reloaded configuration naming the same files).
pub struct PiperTts {
    #[cfg(feature = "piper")]
    shared: std::sync::Arc<on::Shared>,
}

impl PiperTts {
    /// Loads the voice (`workers` sessions, each with its espeak-ng), or reuses the one a
    /// previous configuration loaded from the same files with the same settings.
    pub fn new(cfg: &TtsConfig) -> Result<Self, SetupError> {
        #[cfg(feature = "piper")]
        {
            Ok(Self {
                shared: on::Shared::get(cfg)?,
            })
        }
        #[cfg(not(feature = "piper"))]
        {
            let _ = cfg;
            Err(SetupError::Engine(
                "kind = \"piper\" needs a patterd built with the cargo feature `piper` \
                 (cargo build --release --features piper)"
                    .into(),
            ))
        }
    }
}

impl TtsProvider for PiperTts {
    fn synthesize(&self, text: &str) -> TtsStream {
        #[cfg(feature = "piper")]
        {
            let shared = self.shared.clone();
            let text = text.to_string();
            TtsStream::spawn(move |tx| async move { on::run(shared, text, &tx).await })
        }
        #[cfg(not(feature = "piper"))]
        {
            let _ = text;
            TtsStream::spawn(|_| async {
                Err(super::TtsError::Engine {
                    vendor: "Piper",
                    message: "this patterd was built without the `piper` feature".into(),
                })
            })
        }
    }
}

impl super::kinds::TtsKindImpl for PiperTts {
    fn build(cfg: &TtsConfig) -> Result<Self, SetupError> {
        Self::new(cfg)
    }
    fn credential_check(
        _cfg: &TtsConfig,
        _client: &reqwest::Client,
    ) -> Option<reqwest::RequestBuilder> {
        None
    }
}

#[cfg(feature = "piper")]
mod on {
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex, Weak};

    use tokio::sync::{Semaphore, mpsc};

    use super::engine::{Engine, PieceAudio};
    use super::voice::Voice;
    use crate::config::schema::{TtsConfig, piper_voice_json};
    use crate::provider::error::{SetupError, TtsError};
    use crate::provider::local_tts::{Piece, UlawOut, pieces, spread, voiced_span};
    use crate::provider::{TtsEvent, WordTiming};

    const VENDOR: &str = "Piper";

    /// Piper's own loudness rule: each piece scaled so its peak is near full scale, here to
    /// 0.9 of it, at most 4× (a near-silent piece is not blown up into noise).
    const PEAK: f32 = 0.9;
    const MAX_GAIN: f32 = 4.0;

    /// What identifies a loaded voice: the same files and settings reuse it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Key {
        voice: PathBuf,
        library: PathBuf,
        program: String,
        threads: usize,
        workers: usize,
    }

    /// A loaded voice: its settings, its idle workers and the permits that bound them.
    struct Pool {
        key: Key,
        voice: Voice,
        engines: Mutex<Vec<Engine>>,
        permits: Arc<Semaphore>,
    }

    /// Voices loaded in this process: a reload (or a second table) naming the same files and
    /// settings shares the loaded one instead of loading it again.
    static LOADED: Mutex<Vec<Weak<Pool>>> = Mutex::new(Vec::new());

    /// One `[tts.NAME]`'s use of a voice.
    pub(super) struct Shared {
        pool: Arc<Pool>,
        length_scale: f32,
        word_timestamps: bool,
    }

    fn setup(message: String) -> SetupError {
        SetupError::Engine(message)
    }

    fn failed(message: impl std::fmt::Display) -> TtsError {
        TtsError::Engine {
            vendor: VENDOR,
            message: message.to_string(),
        }
    }

    impl Shared {
        pub(super) fn get(cfg: &TtsConfig) -> Result<Arc<Self>, SetupError> {
            let key = Key {
                voice: cfg.piper_voice(),
                library: cfg.onnxruntime_library(),
                program: cfg.program_or("espeak-ng"),
                threads: cfg.threads.unwrap_or(1).max(1) as usize,
                workers: cfg.workers.unwrap_or(1).max(1) as usize,
            };
            let pool = {
                let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
                loaded.retain(|w| w.strong_count() > 0);
                match loaded
                    .iter()
                    .filter_map(Weak::upgrade)
                    .find(|p| p.key == key)
                {
                    Some(p) => p,
                    None => {
                        let p = Arc::new(Pool::load(key)?);
                        loaded.push(Arc::downgrade(&p));
                        p
                    }
                }
            };
            Ok(Arc::new(Self {
                length_scale: pool.voice.length_scale / cfg.speed.unwrap_or(1.0),
                pool,
                word_timestamps: cfg.word_timestamps,
            }))
        }
    }

    impl Pool {
        fn load(key: Key) -> Result<Self, SetupError> {
            let json_path = piper_voice_json(&key.voice);
            let json = std::fs::read_to_string(&json_path).map_err(|e| {
                setup(format!(
                    "cannot read the Piper voice's settings {}: {e}; run scripts/setup/piper.sh \
                     or set voice_path",
                    json_path.display()
                ))
            })?;
            let voice = Voice::parse(&json).map_err(|e| {
                setup(format!(
                    "the Piper voice {} cannot be used: {e}",
                    json_path.display()
                ))
            })?;
            UlawOut::new(voice.sample_rate)?;
            let env = crate::util::onnxruntime::environment(&key.library).map_err(|e| {
                setup(format!(
                    "{e}; point library at libonnxruntime.so.1.32.0 from the onnxruntime 1.32.0 \
                     wheel (tests/models/setup.sh installs it)"
                ))
            })?;
            let shared_voice = Arc::new(voice.clone());
            let mut engines = Vec::with_capacity(key.workers);
            for _ in 0..key.workers {
                engines.push(
                    Engine::load(
                        env,
                        &key.voice,
                        shared_voice.clone(),
                        &key.program,
                        key.threads,
                    )
                    .map_err(setup)?,
                );
            }
            tracing::info!(
                voice = %key.voice.display(),
                workers = key.workers,
                threads = key.threads,
                "Piper voice loaded"
            );
            Ok(Self {
                permits: Arc::new(Semaphore::new(key.workers)),
                key,
                voice,
                engines: Mutex::new(engines),
            })
        }

        /// Runs one piece on an idle engine (the caller holds a permit, so one is idle); the
        /// engine goes back to the idle list whatever happened (espeak-ng restarts itself).
        fn run_piece(&self, piece: &Piece, length_scale: f32) -> Result<PieceAudio, TtsError> {
            let idle = self.engines.lock().unwrap_or_else(|e| e.into_inner()).pop();
            let mut engine = idle.ok_or_else(|| failed("no idle worker"))?;
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                engine.synthesize(piece, length_scale)
            }));
            self.engines
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(engine);
            match result {
                Ok(r) => r.map_err(failed),
                Err(_) => Err(failed("the synthesis panicked")),
            }
        }
    }

    fn gain(samples: &[f32]) -> f32 {
        let peak = samples.iter().fold(0.0f32, |m, s| m.max(s.abs()));
        if peak > 0.0 {
            (PEAK / peak).min(MAX_GAIN)
        } else {
            1.0
        }
    }

    /// One piece made ready for the carrier: its μ-law (the resampler's tail too when it is
    /// the last), its word timings and its length at the voice's rate.
    struct Ready {
        ulaw: Vec<u8>,
        words: Vec<WordTiming>,
        ms: f64,
    }

    /// Everything a piece costs, on the blocking pool: phonemes, inference, loudness,
    /// resampling and μ-law (none of it on the runtime's threads).
    fn make(
        pool: &Pool,
        piece: &Piece,
        length_scale: f32,
        out: &mut UlawOut,
        offset_ms: f64,
        last: bool,
    ) -> Result<Ready, TtsError> {
        let rate = pool.voice.sample_rate;
        let audio = pool.run_piece(piece, length_scale)?;
        let mut ulaw = if audio.samples.is_empty() {
            Vec::new()
        } else {
            out.push_f32(&audio.samples, gain(&audio.samples))
        };
        if last {
            ulaw.extend(out.finish());
        }
        let words = if audio.samples.is_empty() {
            Vec::new()
        } else {
            spread(&audio.words, voiced_span(&audio.samples, rate), offset_ms)
        };
        Ok(Ready {
            ulaw,
            words,
            ms: audio.samples.len() as f64 * 1000.0 / f64::from(rate),
        })
    }

    /// One text's synthesis: its pieces in order, each made on the blocking pool, its audio
    /// and word timings sent as soon as it is ready.
    pub(super) async fn run(
        shared: Arc<Shared>,
        text: String,
        tx: &mpsc::Sender<TtsEvent>,
    ) -> Result<(), TtsError> {
        let mut out = UlawOut::new(shared.pool.voice.sample_rate).map_err(failed)?;
        let mut offset_ms = 0.0f64;
        let pieces = pieces(&text);
        let count = pieces.len();
        for (i, piece) in pieces.into_iter().enumerate() {
            // Waiting for a permit ends with the stream; a piece started runs to its end on
            // the blocking pool (well under a second) even if the caller barged in.
            let permit = shared
                .pool
                .permits
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| TtsError::Abandoned)?;
            let pool = shared.pool.clone();
            let length_scale = shared.length_scale;
            let (ready, back) = tokio::task::spawn_blocking(move || {
                let _permit = permit;
                let r = make(
                    &pool,
                    &piece,
                    length_scale,
                    &mut out,
                    offset_ms,
                    i + 1 == count,
                );
                (r, out)
            })
            .await
            .map_err(|e| failed(format!("the worker failed: {e}")))?;
            out = back;
            let ready = ready?;
            offset_ms += ready.ms;
            if !ready.ulaw.is_empty() {
                tx.send(TtsEvent::Audio(ready.ulaw.into()))
                    .await
                    .map_err(|_| TtsError::Abandoned)?;
            }
            if shared.word_timestamps && !ready.words.is_empty() {
                tx.send(TtsEvent::Words(ready.words))
                    .await
                    .map_err(|_| TtsError::Abandoned)?;
            }
        }
        Ok(())
    }
}
