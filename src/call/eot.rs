//! End-of-turn classifiers: a model that judges from the caller's last ≤ 8 s of audio whether
//! they finished their turn, asked by the turn state machine at candidate pauses (our detector's
//! silence with caller words pending). It owns the [`EndOfTurnModel`] trait, the answer types
//! the conversation policy takes as an input ([`TurnModelAnswer`]), the actor's 8 s ring of
//! caller audio at 16 kHz ([`CallerRing`]) and the one bounded inference worker shared by every
//! call ([`TurnModelWorker`]: a dedicated thread behind a small queue, so a call never waits; a
//! full queue or a late answer falls back to the silence rules). Without a model (the default)
//! none of this runs and turns end on silence and the speech-to-text's signals alone. The Smart
//! Turn v3.2 model ([`smart_turn`], cargo feature `smart_turn`) is the one implementation.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{info, warn};

use super::policy::TurnModelTiming;
use crate::audio::g711::ulaw_to_linear;
use crate::audio::resample::Resampler;
use crate::config::schema::TurnModelConfig;
#[cfg(feature = "smart_turn")]
use crate::config::schema::TurnModelKind;

#[cfg(feature = "smart_turn")]
pub mod smart_turn;

/// Sample rate the models take.
pub(crate) const MODEL_RATE: u32 = 16_000;
/// Audio a model looks at: the last 8 s.
pub(crate) const WINDOW_SAMPLES: usize = 8 * MODEL_RATE as usize;

/// A failure to judge one pause (logged; the pause falls back to silence timing).
#[derive(Debug, thiserror::Error)]
pub enum EotError {
    #[error("the turn model failed: {0}")]
    Inference(String),
}

/// A classifier of caller audio: the probability (0–1) that the turn is complete.
/// Implementations run on the worker thread and may be slow (tens of ms) but must be bounded.
pub trait EndOfTurnModel: Send {
    /// `audio`: at most [`WINDOW_SAMPLES`] samples at 16 kHz in −1..1, newest last.
    fn complete_probability(&mut self, audio: &[f32]) -> Result<f32, EotError>;
}

/// The model's judgement of one pause.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// The caller finished (probability at or above the threshold).
    Complete(f32),
    /// The caller is mid-thought.
    Incomplete(f32),
    /// No judgement: silence timing decides.
    Unavailable(Unavailable),
}

/// Why a pause got no judgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// The worker's queue was full.
    QueueFull,
    /// The model failed on this audio.
    Failed,
    /// The worker has stopped.
    Stopped,
}

impl Unavailable {
    pub fn as_str(self) -> &'static str {
        match self {
            Unavailable::QueueFull => "queue_full",
            Unavailable::Failed => "failed",
            Unavailable::Stopped => "stopped",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Complete(p) => write!(f, "complete p={p:.3}"),
            Verdict::Incomplete(p) => write!(f, "incomplete p={p:.3}"),
            Verdict::Unavailable(why) => write!(f, "unavailable {}", why.as_str()),
        }
    }
}

/// A `[turn_model.NAME]` that cannot be started (the daemon refuses to start).
#[derive(Debug, thiserror::Error)]
pub enum TurnModelSetupError {
    #[error(
        "[turn_model.{0}] needs Smart Turn, which this patterd was built without; rebuild with \
         `cargo build --release --features smart_turn`"
    )]
    NotCompiled(String),
    #[cfg(feature = "smart_turn")]
    #[error("[turn_model.{0}]: {1}")]
    SmartTurn(String, smart_turn::SmartTurnError),
    #[error("[turn_model.{0}]: cannot start its inference thread: {1}")]
    Thread(String, std::io::Error),
}

/// Starts one worker per `[turn_model.NAME]` (loading its library and model now, so a broken
/// file stops the daemon at start rather than at the first call).
pub(crate) fn start_workers(
    sections: &BTreeMap<String, TurnModelConfig>,
) -> Result<BTreeMap<String, TurnModelWorker>, TurnModelSetupError> {
    let mut out = BTreeMap::new();
    for (name, cfg) in sections {
        let model = load_model(name, cfg)?;
        let settings = TurnModelSettings {
            threshold: cfg.threshold as f32,
            queue: cfg.queue as usize,
            timing: TurnModelTiming {
                answer_wait: Duration::from_millis(cfg.answer_timeout_ms),
                finalize_grace: Duration::from_millis(cfg.finalize_grace_ms),
                incomplete_hold: Duration::from_millis(cfg.incomplete_hold_ms),
            },
        };
        let worker = TurnModelWorker::start(name, model, settings)
            .map_err(|e| TurnModelSetupError::Thread(name.clone(), e))?;
        info!(turn_model = %name, "end-of-turn model loaded");
        out.insert(name.clone(), worker);
    }
    Ok(out)
}

#[cfg(feature = "smart_turn")]
fn load_model(
    name: &str,
    cfg: &TurnModelConfig,
) -> Result<Box<dyn EndOfTurnModel>, TurnModelSetupError> {
    match cfg.kind {
        TurnModelKind::SmartTurn => smart_turn::SmartTurn::load(&cfg.library, &cfg.model)
            .map(|m| Box::new(m) as Box<dyn EndOfTurnModel>)
            .map_err(|e| TurnModelSetupError::SmartTurn(name.to_string(), e)),
    }
}

#[cfg(not(feature = "smart_turn"))]
fn load_model(
    name: &str,
    _cfg: &TurnModelConfig,
) -> Result<Box<dyn EndOfTurnModel>, TurnModelSetupError> {
    Err(TurnModelSetupError::NotCompiled(name.to_string()))
}

/// The answer about pause number `pause` of a call (pauses are numbered by the policy; an
/// answer for an older pause is ignored).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TurnModelAnswer {
    pub pause: u64,
    pub verdict: Verdict,
    /// Microseconds the model took (0 when it did not run).
    pub micros: u64,
}

/// One call's request.
struct Job {
    pause: u64,
    audio: Vec<f32>,
    reply: mpsc::Sender<TurnModelAnswer>,
}

/// The shared inference worker: one thread owning the model, fed through a bounded queue.
/// Cloning shares the worker. Dropping the last clone stops the thread.
#[derive(Clone)]
pub struct TurnModelWorker {
    tx: std_mpsc::SyncSender<Job>,
    settings: TurnModelSettings,
    _stop: Arc<()>,
}

/// How a worker judges and how long calls wait for it (`[turn_model.NAME]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TurnModelSettings {
    /// A probability at least this is [`Verdict::Complete`].
    pub threshold: f32,
    /// Requests that may wait for the worker (at least 1); more are refused at once.
    pub queue: usize,
    pub timing: TurnModelTiming,
}

impl TurnModelWorker {
    /// Starts the worker thread named after `name` with `model`.
    pub fn start(
        name: &str,
        model: Box<dyn EndOfTurnModel>,
        settings: TurnModelSettings,
    ) -> std::io::Result<Self> {
        let threshold = settings.threshold;
        let (tx, rx) = std_mpsc::sync_channel::<Job>(settings.queue.max(1));
        let mut model = model;
        std::thread::Builder::new()
            .name(format!("turn-model-{name}"))
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    let t = std::time::Instant::now();
                    let verdict = match model.complete_probability(&job.audio) {
                        Ok(p) if p >= threshold => Verdict::Complete(p),
                        Ok(p) => Verdict::Incomplete(p),
                        Err(e) => {
                            warn!(error = %e, "turn model failed; the pause is judged by silence");
                            Verdict::Unavailable(Unavailable::Failed)
                        }
                    };
                    let micros = t.elapsed().as_micros() as u64;
                    // A call that ended or is flooded simply misses its answer.
                    let _ = job.reply.try_send(TurnModelAnswer {
                        pause: job.pause,
                        verdict,
                        micros,
                    });
                }
                info!("turn model worker stopped");
            })?;
        Ok(Self {
            tx,
            settings,
            _stop: Arc::new(()),
        })
    }

    pub fn timing(&self) -> TurnModelTiming {
        self.settings.timing
    }

    /// Queues a judgement of `audio` for `pause`; never waits. `Err` carries the immediate
    /// answer when the queue is full or the worker stopped.
    pub(crate) fn submit(
        &self,
        pause: u64,
        audio: Vec<f32>,
        reply: &mpsc::Sender<TurnModelAnswer>,
    ) -> Result<(), TurnModelAnswer> {
        let job = Job {
            pause,
            audio,
            reply: reply.clone(),
        };
        self.tx.try_send(job).map_err(|e| {
            let why = match e {
                std_mpsc::TrySendError::Full(_) => Unavailable::QueueFull,
                std_mpsc::TrySendError::Disconnected(_) => Unavailable::Stopped,
            };
            TurnModelAnswer {
                pause,
                verdict: Verdict::Unavailable(why),
                micros: 0,
            }
        })
    }
}

/// The last 8 s of the caller's audio at 16 kHz, kept by the actor (only when the agent has a
/// turn model): μ-law is decoded and upsampled 2× with the project's resampler.
pub struct CallerRing {
    resampler: Option<Resampler>,
    buf: Vec<i16>,
    /// Next write position once the ring is full.
    head: usize,
    full: bool,
    scratch: Vec<i16>,
    pcm: Vec<i16>,
}

impl Default for CallerRing {
    fn default() -> Self {
        Self::new()
    }
}

impl CallerRing {
    pub fn new() -> Self {
        Self {
            resampler: Resampler::new(8_000, MODEL_RATE).ok(),
            buf: Vec::with_capacity(WINDOW_SAMPLES),
            head: 0,
            full: false,
            scratch: Vec::new(),
            pcm: Vec::new(),
        }
    }

    /// Adds one frame of 8 kHz μ-law.
    pub fn push_ulaw(&mut self, ulaw: &[u8]) {
        self.pcm.clear();
        self.pcm.extend(ulaw.iter().map(|&b| ulaw_to_linear(b)));
        self.scratch.clear();
        match &mut self.resampler {
            Some(r) => r.push(&self.pcm, &mut self.scratch),
            // No resampler (cannot happen for 8→16 kHz): repeat each sample.
            None => self.scratch.extend(self.pcm.iter().flat_map(|&s| [s, s])),
        }
        let scratch = std::mem::take(&mut self.scratch);
        self.push_16k(&scratch);
        self.scratch = scratch;
    }

    /// Adds 16 kHz samples.
    pub(crate) fn push_16k(&mut self, samples: &[i16]) {
        for &s in samples {
            if !self.full {
                self.buf.push(s);
                if self.buf.len() == WINDOW_SAMPLES {
                    self.full = true;
                    self.head = 0;
                }
            } else {
                self.buf[self.head] = s;
                self.head = (self.head + 1) % WINDOW_SAMPLES;
            }
        }
    }

    /// The audio held, oldest first, as floats in −1..1.
    pub fn snapshot(&self) -> Vec<f32> {
        let (newer, older) = if self.full {
            (&self.buf[..self.head], &self.buf[self.head..])
        } else {
            (&self.buf[..], &self.buf[..0])
        };
        older
            .iter()
            .chain(newer)
            .map(|&s| f32::from(s) / 32768.0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_last_eight_seconds_in_order() {
        let mut r = CallerRing::new();
        let samples: Vec<i16> = (0..WINDOW_SAMPLES + 1000)
            .map(|i| (i % 30000) as i16)
            .collect();
        r.push_16k(&samples[..5000]);
        assert_eq!(r.snapshot().len(), 5000);
        r.push_16k(&samples[5000..]);
        let snap = r.snapshot();
        assert_eq!(snap.len(), WINDOW_SAMPLES);
        assert_eq!(snap[0], f32::from(samples[1000]) / 32768.0);
        assert_eq!(
            *snap.last().unwrap(),
            f32::from(*samples.last().unwrap()) / 32768.0
        );
    }

    #[test]
    fn ulaw_frames_become_16k_audio() {
        let mut r = CallerRing::new();
        for _ in 0..50 {
            r.push_ulaw(&crate::audio::g711::ulaw_tone(440.0, 20, 8000));
        }
        // One second of 8 kHz is about one second at 16 kHz (the resampler holds a little back).
        let n = r.snapshot().len();
        assert!((15_000..=16_000).contains(&n), "{n}");
    }

    struct Fixed(f32);
    impl EndOfTurnModel for Fixed {
        fn complete_probability(&mut self, audio: &[f32]) -> Result<f32, EotError> {
            if audio.is_empty() {
                return Err(EotError::Inference("no audio".into()));
            }
            Ok(self.0)
        }
    }

    /// Answers only when the test releases it.
    struct Gated(std_mpsc::Receiver<()>);
    impl EndOfTurnModel for Gated {
        fn complete_probability(&mut self, _: &[f32]) -> Result<f32, EotError> {
            let _ = self.0.recv();
            Ok(0.2)
        }
    }

    fn settings(queue: usize) -> TurnModelSettings {
        TurnModelSettings {
            threshold: 0.5,
            queue,
            timing: TurnModelTiming {
                answer_wait: std::time::Duration::from_millis(200),
                finalize_grace: std::time::Duration::from_millis(200),
                incomplete_hold: std::time::Duration::from_millis(1500),
            },
        }
    }

    #[tokio::test]
    async fn the_worker_answers_with_the_threshold_applied_and_refuses_when_full() {
        let w = TurnModelWorker::start("t", Box::new(Fixed(0.7)), settings(1)).unwrap();
        let (tx, mut rx) = mpsc::channel(4);
        w.submit(1, vec![0.0; 10], &tx).unwrap();
        let a = rx.recv().await.unwrap();
        assert_eq!(a.pause, 1);
        assert_eq!(a.verdict, Verdict::Complete(0.7));
        w.submit(2, Vec::new(), &tx).unwrap();
        assert_eq!(
            rx.recv().await.unwrap().verdict,
            Verdict::Unavailable(Unavailable::Failed)
        );
        let (release, gate) = std_mpsc::channel();
        let w = TurnModelWorker::start("t", Box::new(Gated(gate)), settings(1)).unwrap();
        // One runs (blocked) or waits, one waits: of three, at least one is refused at once.
        let refused: Vec<_> = (0..3)
            .filter_map(|i| w.submit(i, vec![0.0; 10], &tx).err())
            .collect();
        assert!(!refused.is_empty());
        assert_eq!(
            refused[0].verdict,
            Verdict::Unavailable(Unavailable::QueueFull)
        );
        for _ in 0..3 {
            let _ = release.send(());
        }
        let a = rx.recv().await.unwrap();
        assert_eq!((a.pause, a.verdict), (0, Verdict::Incomplete(0.2)));
    }
}
