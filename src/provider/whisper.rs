//! Speech-to-text inside patterd, kind `whisper`: OpenAI's Whisper run in-process by
//! whisper.cpp (the `whisper-rs` crate, cargo feature `whisper`), with no server and no
//! account. Nothing streams, exactly as for `openai_compatible`: the same voice-activity cutter
//! (`openai_stt::Cutter`) ends each utterance after `endpointing_ms` of silence, the shared
//! per-utterance session (`openai_stt::run`) hands it here, and its text becomes a final;
//! interim words are not promised. The texts of a sentence cut at a pause are held until the
//! session settles and sent as one final (`Transcriber::SETTLE`: a decode takes seconds, and
//! an early half would let `max_endpointing_ms` end the turn). The utterance (μ-law 8 kHz) is decoded to PCM, brought to
//! 16 kHz with the band-limited [`Resampler`], and queued for a bounded pool of decoder
//! threads ([`Pool`]: `threads`, default one per core, each with its own whisper.cpp state over
//! one shared model, at nice [`DECODER_NICE`] so the calls' media keeps its cores; `queue`
//! utterances may wait). A full queue refuses the utterance: in a chain with a next STT
//! (`SttContext::fallback`) that is a fatal error, so the chain moves the call to its next
//! engine (and a session is refused at once if the queue is full when it opens); alone, a
//! non-fatal error on the call's timeline and an empty final, so the turn still ends.
//!
//! Decoding is greedy at temperature 0 (no fallback to higher temperatures) in one segment
//! with timestamp tokens; whisper.cpp gives an English-only (`.en`) model the prompt it was
//! trained with (`<|startoftranscript|>` alone: no language or task token) and a multilingual
//! one `language` and `transcribe`. Guards against Whisper's failure modes on phone audio:
//! utterances the detector heard less than `openai_stt::MIN_SPEECH_MS` of speech in are never
//! decoded; whisper.cpp drops a segment whose no-speech probability (read right after
//! `<|startoftranscript|>`, which is why timestamps stay on) is over 0.6 with an average log
//! probability under −1 (OpenAI's rule), and we drop any over [`NO_SPEECH_DROP`]; non-speech
//! tokens are suppressed and whatever still reads as an annotation (`[BLANK_AUDIO]`,
//! `(coughing)`, `♪`) is removed; the token budget is proportional to the audio
//! ([`token_cap`]), and a phrase repeated three times or more in a row ([`truncate_loop`]) is
//! cut back to its first occurrence.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{mpsc, oneshot};

use super::error::SetupError;
use super::openai_stt::{Cutter, Transcriber, Utterance, run};
use super::{SttContext, SttEvent, SttProvider, SttStream};
use crate::audio::g711::decode_ulaw;
use crate::audio::resample::Resampler;
use crate::config::schema::SttConfig;
use crate::util::TaskGuard;

/// Input queue: about 20 s of 20 ms carrier frames (as `openai_compatible`).
const INPUT_QUEUE: usize = 1024;
/// Decoder threads' nice value (Linux): a decode is a second of CPU that can wait a few
/// milliseconds; the runtime's workers, pacing every call's audio, cannot.
pub(crate) const DECODER_NICE: i32 = 10;
/// A decode whose no-speech probability is above this is dropped, whatever it says.
pub(crate) const NO_SPEECH_DROP: f32 = 0.8;
/// Token budget: this many, plus [`TOKENS_PER_SECOND`] per second of audio.
const TOKENS_BASE: u64 = 10;
/// Fast conversational English is about 4 words (5–6 tokens with punctuation) a second.
const TOKENS_PER_SECOND: u64 = 8;
/// The longest phrase [`truncate_loop`] looks for, in words.
const LOOP_MAX_WORDS: usize = 8;
/// A run of repeats shorter than this many words is kept ("no, no, no"; "bye bye bye").
const LOOP_MIN_RUN_WORDS: usize = 6;

// ---------------------------------------------------------------- the provider

pub(crate) struct WhisperStt {
    pool: Arc<Pool>,
    endpointing_ms: u64,
}

impl SttProvider for WhisperStt {
    fn endpointing_ms(&self) -> u64 {
        self.endpointing_ms
    }

    fn open(&self, ctx: &SttContext) -> SttStream {
        let (in_tx, in_rx) = mpsc::channel(INPUT_QUEUE);
        let (ev_tx, ev_rx) = mpsc::channel(64);
        let local = Local {
            pool: self.pool.clone(),
            call_id: ctx.call_id.clone(),
            fallback: ctx.fallback,
        };
        let refuse = ctx.fallback && self.pool.full();
        let cutter = Cutter::new(self.endpointing_ms);
        let task = tokio::spawn(async move {
            if refuse {
                // A chain's next STT takes the call rather than queueing behind a full pool.
                let e = DecodeError::Busy {
                    threads: local.pool.threads,
                    queue: local.pool.queue,
                    fallback: true,
                };
                let _ = ev_tx
                    .send(SttEvent::Error {
                        message: e.to_string(),
                        fatal: true,
                    })
                    .await;
            } else {
                run(in_rx, &ev_tx, cutter, local).await;
            }
            let _ = ev_tx.send(SttEvent::Closed).await;
        });
        SttStream {
            input: in_tx,
            events: ev_rx,
            guard: TaskGuard::new(task),
        }
    }
}

impl super::kinds::SttKindImpl for WhisperStt {
    fn build(cfg: &SttConfig) -> Result<Self, SetupError> {
        let threads = cfg
            .threads
            .map(|t| t as usize)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1);
        let queue = cfg.queue.map_or(2 * threads, |q| q as usize);
        let pool = Pool::shared(
            PoolKey {
                model: cfg.model_path.trim().to_string(),
                language: cfg.language.clone(),
                threads,
                queue,
            },
            engine::open,
        )?;
        Ok(Self {
            pool,
            endpointing_ms: u64::from(cfg.endpointing_ms),
        })
    }

    /// No credential: nothing to ask.
    fn credential_check(
        _cfg: &SttConfig,
        _client: &reqwest::Client,
    ) -> Option<reqwest::RequestBuilder> {
        None
    }
}

// ---------------------------------------------------------------- one call's transcriptions

/// Why one utterance got no text.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecodeError {
    #[error(
        "all {threads} whisper decoders are busy and {queue} utterances are already waiting, so this utterance was not transcribed{}",
        if *fallback { "; the next STT of the chain takes over" } else { " (raise [stt] threads or queue on a machine with more cores, or add a fallback: stt = [\"local\", \"deepgram\"])" }
    )]
    Busy {
        threads: usize,
        queue: usize,
        fallback: bool,
    },
    #[error("whisper could not decode the utterance: {0}")]
    Decode(String),
    #[error("the whisper decoder threads are gone")]
    Stopped,
}

impl DecodeError {
    /// A full pool ends the session only when a chain can switch to its next STT.
    fn fatal(&self) -> bool {
        match self {
            DecodeError::Busy { fallback, .. } => *fallback,
            DecodeError::Decode(_) => false,
            DecodeError::Stopped => true,
        }
    }
}

struct Local {
    pool: Arc<Pool>,
    call_id: String,
    fallback: bool,
}

impl Transcriber for Local {
    type Error = DecodeError;

    async fn transcribe(&self, u: &Utterance) -> Result<String, DecodeError> {
        let pcm = to_16k(&u.ulaw);
        let audio_ms = u.ulaw.len() as u64 / 8;
        let reply = self.pool.submit(pcm, token_cap(audio_ms), self.fallback)?;
        let raw = reply.await.map_err(|_| DecodeError::Stopped)??;
        let text = clean(&raw);
        if text.len() != raw.text.trim().len() {
            tracing::debug!(call = %self.call_id, no_speech = raw.no_speech, "whisper output guarded");
        }
        Ok(text)
    }

    fn fatal(e: &DecodeError) -> bool {
        e.fatal()
    }

    /// A decode takes seconds: the halves of a sentence cut at a pause become one final.
    const SETTLE: bool = true;

    fn call_id(&self) -> &str {
        &self.call_id
    }
}

/// μ-law 8 kHz as whisper's input: PCM at 16 kHz in [-1, 1).
pub(crate) fn to_16k(ulaw: &[u8]) -> Vec<f32> {
    let pcm8 = decode_ulaw(ulaw);
    let mut pcm16 = Vec::with_capacity(pcm8.len() * 2 + 320);
    match Resampler::new(8_000, 16_000) {
        Ok(mut r) => {
            r.push(&pcm8, &mut pcm16);
            r.finish(&mut pcm16);
        }
        // Both rates are supported ones; never taken.
        Err(_) => pcm16 = pcm8.iter().flat_map(|&s| [s, s]).collect(),
    }
    pcm16.iter().map(|&s| f32::from(s) / 32768.0).collect()
}

// ---------------------------------------------------------------- guards

/// What a decoder returns for one utterance.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Raw {
    pub text: String,
    /// Whisper's probability that the audio held no speech (`<|nospeech|>` at the first step).
    pub no_speech: f32,
}

/// The most tokens a decode of `audio_ms` of audio may produce: a loop stops at this budget
/// instead of filling the model's 224-token window.
pub(crate) fn token_cap(audio_ms: u64) -> u32 {
    (TOKENS_BASE + audio_ms * TOKENS_PER_SECOND / 1000).min(224) as u32
}

/// The text worth keeping from a decode: empty when Whisper itself thinks there was no
/// speech, annotations removed, a loop cut back, empty when no word is left.
pub(crate) fn clean(raw: &Raw) -> String {
    if raw.no_speech > NO_SPEECH_DROP {
        return String::new();
    }
    let text = strip_annotations(&raw.text);
    let text = truncate_loop(text.trim());
    if text.chars().any(char::is_alphanumeric) {
        text.trim().to_string()
    } else {
        String::new()
    }
}

/// Removes what Whisper writes for sounds rather than words: `[BLANK_AUDIO]`, `(coughing)`,
/// `*music*`, `♪`.
pub(crate) fn strip_annotations(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut close: Option<char> = None;
    for c in text.chars() {
        match close {
            Some(end) if c == end => close = None,
            Some(_) => {}
            None => match c {
                '[' => close = Some(']'),
                '(' => close = Some(')'),
                '*' => close = Some('*'),
                '♪' | '♫' | '♬' => {}
                _ => out.push(c),
            },
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Cuts a repetition loop: when a phrase of up to [`LOOP_MAX_WORDS`] words comes three times
/// or more in a row, covering at least [`LOOP_MIN_RUN_WORDS`] words, the text ends after its
/// first occurrence (what follows a loop is the loop running on). Words compare without case
/// or punctuation; the kept text is the original's.
pub(crate) fn truncate_loop(text: &str) -> &str {
    // (end offset in `text`, normalised word) for each word with a letter or digit.
    let words: Vec<(usize, String)> = word_spans(text)
        .filter_map(|(_, end, w)| {
            let norm: String = w
                .chars()
                .filter(|c| c.is_alphanumeric())
                .flat_map(char::to_lowercase)
                .collect();
            (!norm.is_empty()).then_some((end, norm))
        })
        .collect();
    let n = words.len();
    for start in 0..n {
        for len in 1..=LOOP_MAX_WORDS.min((n - start) / 3) {
            let phrase = &words[start..start + len];
            let mut copies = 1;
            while start + (copies + 1) * len <= n
                && words[start + copies * len..start + (copies + 1) * len]
                    .iter()
                    .zip(phrase)
                    .all(|(a, b)| a.1 == b.1)
            {
                copies += 1;
            }
            if copies >= 3 && copies * len >= LOOP_MIN_RUN_WORDS {
                let end = phrase[len - 1].0;
                return text[..end].trim_end_matches([',', ';', ':', '-', ' ']);
            }
        }
    }
    text
}

/// `(start, end, word)` of each whitespace-separated word.
fn word_spans(text: &str) -> impl Iterator<Item = (usize, usize, &str)> {
    text.split_whitespace().map(move |w| {
        let start = w.as_ptr() as usize - text.as_ptr() as usize;
        (start, start + w.len(), w)
    })
}

// ---------------------------------------------------------------- the decoder pool

/// Decodes one utterance: 16 kHz PCM and a token budget in, text out. One per decoder
/// thread (whisper.cpp's state is not shared between threads).
pub(crate) trait Decode: Send + 'static {
    fn decode(&mut self, pcm: &[f32], max_tokens: u32) -> Result<Raw, String>;
}

/// Makes `threads` decoders over one loaded model.
pub(crate) type Open = fn(&PoolKey) -> Result<Vec<Box<dyn Decode>>, SetupError>;

/// What makes two `[stt.*]` tables (or a reload's rebuild) share one pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PoolKey {
    pub model: String,
    pub language: String,
    pub threads: usize,
    pub queue: usize,
}

struct Job {
    pcm: Vec<f32>,
    max_tokens: u32,
    reply: oneshot::Sender<Result<Raw, DecodeError>>,
}

/// A bounded pool of decoder threads behind a bounded queue of utterances.
pub(crate) struct Pool {
    jobs: std::sync::mpsc::SyncSender<Job>,
    /// Utterances queued and not yet taken by a decoder.
    waiting: Arc<AtomicUsize>,
    /// Decoders decoding now.
    busy: Arc<AtomicUsize>,
    pub(crate) threads: usize,
    pub(crate) queue: usize,
}

/// Pools alive in this process: a reload (or a second table naming the same file) reuses the
/// loaded model and its threads instead of loading them again.
static POOLS: Mutex<Vec<(PoolKey, Weak<Pool>)>> = Mutex::new(Vec::new());

impl Pool {
    /// The live pool for `key`, or a new one from `open`'s decoders.
    pub(crate) fn shared(key: PoolKey, open: Open) -> Result<Arc<Pool>, SetupError> {
        let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
        pools.retain(|(_, w)| w.strong_count() > 0);
        if let Some(p) = pools
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(p);
        }
        let pool = Arc::new(Pool::start(open(&key)?, key.queue));
        pools.push((key, Arc::downgrade(&pool)));
        Ok(pool)
    }

    /// Starts one thread per decoder; they end when the pool is dropped.
    pub(crate) fn start(decoders: Vec<Box<dyn Decode>>, queue: usize) -> Pool {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(queue);
        let rx = Arc::new(Mutex::new(rx));
        let waiting = Arc::new(AtomicUsize::new(0));
        let busy = Arc::new(AtomicUsize::new(0));
        let threads = decoders.len();
        for (i, mut d) in decoders.into_iter().enumerate() {
            let rx = rx.clone();
            let waiting = waiting.clone();
            let busy = busy.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("whisper-{i}"))
                .spawn(move || {
                    lower_own_priority();
                    loop {
                        let job = {
                            let rx = rx.lock().unwrap_or_else(|e| e.into_inner());
                            match rx.recv() {
                                Ok(j) => j,
                                Err(_) => return,
                            }
                        };
                        waiting.fetch_sub(1, Ordering::AcqRel);
                        // The call is gone: nobody waits for this one.
                        if job.reply.is_closed() {
                            continue;
                        }
                        busy.fetch_add(1, Ordering::AcqRel);
                        let r = d
                            .decode(&job.pcm, job.max_tokens)
                            .map_err(DecodeError::Decode);
                        busy.fetch_sub(1, Ordering::AcqRel);
                        let _ = job.reply.send(r);
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "could not start a whisper decoder thread");
            }
        }
        Pool {
            jobs: tx,
            waiting,
            busy,
            threads,
            queue,
        }
    }

    /// Whether an utterance submitted now would wait with `queue` others, i.e. be refused.
    pub(crate) fn full(&self) -> bool {
        self.busy.load(Ordering::Acquire) >= self.threads
            && self.waiting.load(Ordering::Acquire) >= self.queue
    }

    /// Queues one utterance; refused at once when `queue` utterances already wait.
    pub(crate) fn submit(
        &self,
        pcm: Vec<f32>,
        max_tokens: u32,
        fallback: bool,
    ) -> Result<oneshot::Receiver<Result<Raw, DecodeError>>, DecodeError> {
        let (reply, rx) = oneshot::channel();
        // Counted before the send so a decoder's decrement can never come first.
        self.waiting.fetch_add(1, Ordering::AcqRel);
        match self.jobs.try_send(Job {
            pcm,
            max_tokens,
            reply,
        }) {
            Ok(()) => Ok(rx),
            Err(e) => {
                self.waiting.fetch_sub(1, Ordering::AcqRel);
                Err(match e {
                    std::sync::mpsc::TrySendError::Full(_) => DecodeError::Busy {
                        threads: self.threads,
                        queue: self.queue,
                        fallback,
                    },
                    std::sync::mpsc::TrySendError::Disconnected(_) => DecodeError::Stopped,
                })
            }
        }
    }
}

/// Lowers the calling thread's CPU priority to [`DECODER_NICE`] (Linux: nice is per thread;
/// raising it needs no privilege). Elsewhere, or if refused, the thread keeps its priority.
fn lower_own_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain system calls on the calling thread's own id; no memory is passed.
        let rc = unsafe {
            libc::setpriority(
                libc::PRIO_PROCESS,
                libc::gettid() as libc::id_t,
                DECODER_NICE,
            )
        };
        if rc != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "whisper decoder keeps its priority");
        }
    }
}

// ---------------------------------------------------------------- whisper.cpp

#[cfg(not(feature = "whisper"))]
mod engine {
    use super::*;

    /// Validation refuses `kind = "whisper"` in a build without the feature; this is the
    /// same refusal for a caller that skipped it.
    pub(super) fn open(_key: &PoolKey) -> Result<Vec<Box<dyn Decode>>, SetupError> {
        Err(SetupError::Engine(
            "kind = \"whisper\" needs a patterd built with the cargo feature `whisper` \
             (cargo build --release --features whisper)"
                .into(),
        ))
    }
}

#[cfg(feature = "whisper")]
mod engine {
    use super::*;
    use whisper_rs::{
        FullParams, SamplingStrategy, WhisperContext, WhisperContextParameters, WhisperState,
    };

    /// Loads the model once and makes one whisper.cpp state per thread.
    pub(super) fn open(key: &PoolKey) -> Result<Vec<Box<dyn Decode>>, SetupError> {
        quiet_logs();
        let path = std::path::Path::new(&key.model);
        if !path.is_file() {
            return Err(SetupError::Engine(format!(
                "model_path = {:?} is not a file: run scripts/setup/whisper.sh, which prints \
                 PATTERD_WHISPER_MODEL=<the path to use>",
                key.model
            )));
        }
        let mut params = WhisperContextParameters::default();
        params.use_gpu(false);
        let ctx = WhisperContext::new_with_params(path, params).map_err(|e| {
            SetupError::Engine(format!(
                "model_path = {:?} is not a whisper.cpp (ggml) model ({e}): convert it with \
                 scripts/setup/whisper.sh",
                key.model
            ))
        })?;
        let multilingual = ctx.is_multilingual();
        tracing::info!(model = %key.model, multilingual, threads = key.threads, queue = key.queue, "whisper model loaded");
        // whisper.cpp detects the language when none is given, even for an English-only
        // model (which ignores it in its prompt): always name one.
        let language = if multilingual {
            key.language.clone()
        } else {
            "en".to_string()
        };
        let ctx = Arc::new(ctx);
        let mut out: Vec<Box<dyn Decode>> = Vec::with_capacity(key.threads);
        for _ in 0..key.threads {
            let state = ctx.create_state().map_err(|e| {
                SetupError::Engine(format!("whisper could not allocate a decoder: {e}"))
            })?;
            out.push(Box::new(Decoder {
                _ctx: ctx.clone(),
                state,
                language: language.clone(),
            }));
        }
        Ok(out)
    }

    /// Encoder positions beyond the utterance's end (20 ms each).
    const AUDIO_CTX_MARGIN: usize = 64;
    /// The fewest encoder positions a decode gets.
    const AUDIO_CTX_MIN: usize = 256;

    /// The encoder positions a decode of `samples` (16 kHz) needs: one per 20 ms of audio, plus
    /// [`AUDIO_CTX_MARGIN`], at least [`AUDIO_CTX_MIN`], at most the model's 1,500 (30 s).
    fn audio_ctx(samples: usize) -> i32 {
        (samples.div_ceil(320) + AUDIO_CTX_MARGIN).clamp(AUDIO_CTX_MIN, 1500) as i32
    }

    #[test]
    fn the_encoder_window_follows_the_utterance() {
        // 1 s: the floor; 8 s: 400 positions + the margin; 40 s: the model's whole window.
        assert_eq!(audio_ctx(16_000), AUDIO_CTX_MIN as i32);
        assert_eq!(audio_ctx(8 * 16_000), 400 + AUDIO_CTX_MARGIN as i32);
        assert_eq!(audio_ctx(40 * 16_000), 1500);
    }

    struct Decoder {
        /// Keeps the model alive as long as its states.
        _ctx: Arc<WhisperContext>,
        state: WhisperState,
        /// `language`, or "en" for an English-only model (whose prompt has no language token).
        language: String,
    }

    impl Decode for Decoder {
        fn decode(&mut self, pcm: &[f32], max_tokens: u32) -> Result<Raw, String> {
            let mut p = FullParams::new(SamplingStrategy::Greedy { best_of: 1 });
            p.set_n_threads(1);
            p.set_language(Some(&self.language));
            p.set_translate(false);
            p.set_no_context(true);
            // With timestamps the prompt is `<|startoftranscript|>` alone, and whisper.cpp reads
            // the no-speech probability right after it, where the model was trained to put
            // it; after `<|notimestamps|>` it is near zero even for silence.
            p.set_no_timestamps(false);
            p.set_single_segment(true);
            p.set_max_tokens(max_tokens as i32);
            p.set_temperature(0.0);
            p.set_temperature_inc(0.0);
            p.set_suppress_blank(true);
            p.set_suppress_nst(true);
            p.set_print_progress(false);
            p.set_print_realtime(false);
            p.set_print_special(false);
            p.set_print_timestamps(false);
            // The encoder reads only as much of its 30 s window as the utterance fills (plus a
            // margin): its cost is proportional to `audio_ctx`, and a phone turn is 1–8 s of a
            // 30 s window, so the full window spends most of a decode on padding.
            p.set_audio_ctx(audio_ctx(pcm.len()));
            // At least 1 s: whisper.cpp refuses under 100 ms.
            let mut padded;
            let pcm = if pcm.len() < 16_000 {
                padded = pcm.to_vec();
                padded.resize(16_000, 0.0);
                &padded[..]
            } else {
                pcm
            };
            self.state.full(p, pcm).map_err(|e| e.to_string())?;
            let mut raw = Raw::default();
            for seg in self.state.as_iter() {
                raw.text
                    .push_str(&seg.to_str_lossy().map_err(|e| e.to_string())?);
                raw.no_speech = raw.no_speech.max(seg.no_speech_probability());
            }
            Ok(raw)
        }
    }

    /// whisper.cpp and ggml print to stderr unless told otherwise: their messages go to our
    /// log instead, at debug (load and decode details) or warn (their warnings and errors).
    fn quiet_logs() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: installs a plain C callback that only reads the NUL-terminated string
            // it is given, for the life of the process; no user data pointer.
            unsafe {
                whisper_rs::whisper_rs_sys::whisper_log_set(Some(log), std::ptr::null_mut());
                whisper_rs::whisper_rs_sys::ggml_log_set(Some(log), std::ptr::null_mut());
            }
        });
    }

    unsafe extern "C" fn log(
        level: whisper_rs::whisper_rs_sys::ggml_log_level,
        text: *const std::ffi::c_char,
        _user: *mut std::ffi::c_void,
    ) {
        use whisper_rs::whisper_rs_sys::{
            ggml_log_level_GGML_LOG_LEVEL_ERROR as ERROR,
            ggml_log_level_GGML_LOG_LEVEL_WARN as WARN,
        };
        let warn = level == WARN || level == ERROR;
        if text.is_null()
            || !(warn || tracing::enabled!(target: "patterd::whisper_cpp", tracing::Level::DEBUG))
        {
            return;
        }
        // SAFETY: whisper.cpp passes a valid NUL-terminated string for the call's duration.
        let text = unsafe { std::ffi::CStr::from_ptr(text) }.to_string_lossy();
        let text = text.trim();
        if text.is_empty() {
            return;
        }
        if warn {
            tracing::warn!(target: "patterd::whisper_cpp", "{text}");
        } else {
            tracing::debug!(target: "patterd::whisper_cpp", "{text}");
        }
    }
}

#[cfg(test)]
mod tests;
