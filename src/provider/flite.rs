//! `[tts.NAME] kind = "flite"`: CMU flite run on this machine, the light fallback that needs
//! no model files (Debian's `flite`, voices built in: `rms` by default). Each piece of a
//! sentence (`local_tts::pieces`) is one `flite -voice V -t TEXT -o /dev/stdout` run (a
//! process start costs about 0.05 s; flite synthesises at ~0.02 RTF), at most `workers` at
//! once over every call; its 16 kHz WAV is resampled to μ-law 8 kHz and sent piece by piece.
//! flite reports no alignment, so each piece's word timings are estimated from its words'
//! letters over its voiced audio. A dropped stream kills the running process.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::sync::{Semaphore, mpsc};

use super::error::{SetupError, TtsError};
use super::local_tts::{UlawOut, letter_weight, pieces, spread, voiced_span};
use super::{TtsEvent, TtsProvider, TtsStream, WordTiming};
use crate::audio::wav::read_pcm16;
use crate::config::schema::TtsConfig;

const VENDOR: &str = "flite";

/// Longest one piece may take (flite needs well under a second for any piece).
const PIECE_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest WAV accepted from one run: 60 s at 16 kHz 16-bit (a piece is a clause).
const MAX_WAV_BYTES: usize = 2 * 1024 * 1024;

pub struct FliteTts {
    program: String,
    voice: String,
    /// `--setf duration_stretch=…` for `speed`.
    stretch: Option<f32>,
    permits: Arc<Semaphore>,
    word_timestamps: bool,
    timeout: Duration,
}

impl FliteTts {
    pub fn new(cfg: &TtsConfig) -> Result<Self, SetupError> {
        let program = cfg.program_or("flite");
        if crate::util::find_program(&program).is_none() {
            return Err(SetupError::Engine(format!(
                "kind = \"flite\" runs the flite program, and {program:?} is not found; install \
                 it (`apt-get install flite`) or set program to its path"
            )));
        }
        Ok(Self {
            program,
            voice: if cfg.voice_id.is_empty() {
                "rms".into()
            } else {
                cfg.voice_id.clone()
            },
            stretch: cfg.speed.filter(|s| *s > 0.0).map(|s| 1.0 / s),
            permits: Arc::new(Semaphore::new(cfg.workers.unwrap_or(2).max(1) as usize)),
            word_timestamps: cfg.word_timestamps,
            timeout: PIECE_TIMEOUT,
        })
    }

    fn command(&self, text: &str) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.arg("-voice").arg(&self.voice);
        if let Some(s) = self.stretch {
            cmd.arg("--setf").arg(format!("duration_stretch={s}"));
        }
        // `-t` takes the next argument as the text whatever it looks like.
        cmd.arg("-t").arg(text).arg("-o").arg("/dev/stdout");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        cmd
    }
}

impl TtsProvider for FliteTts {
    fn synthesize(&self, text: &str) -> TtsStream {
        let jobs: Vec<_> = pieces(text)
            .into_iter()
            .map(|p| {
                let words: Vec<(String, f32)> = p
                    .clauses
                    .iter()
                    .flat_map(|c| c.words().map(|w| (w.to_string(), letter_weight(w))))
                    .collect();
                (self.command(&p.text()), words)
            })
            .collect();
        let permits = self.permits.clone();
        let (timestamps, timeout) = (self.word_timestamps, self.timeout);
        TtsStream::spawn(
            move |tx| async move { run(jobs, permits, timestamps, timeout, &tx).await },
        )
    }
}

fn failed(message: impl std::fmt::Display) -> TtsError {
    TtsError::Engine {
        vendor: VENDOR,
        message: message.to_string(),
    }
}

/// One flite run: the WAV it wrote.
async fn run_one(mut cmd: tokio::process::Command, timeout: Duration) -> Result<Vec<u8>, TtsError> {
    let mut child = cmd
        .spawn()
        .map_err(|e| failed(format!("cannot start: {e}")))?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| failed("no pipe to the process"))?;
    let work = async {
        let mut wav = Vec::new();
        (&mut stdout)
            .take(MAX_WAV_BYTES as u64 + 1)
            .read_to_end(&mut wav)
            .await
            .map_err(|e| failed(format!("reading its audio: {e}")))?;
        if wav.len() > MAX_WAV_BYTES {
            return Err(failed("it wrote more audio than a piece can hold"));
        }
        let status = child
            .wait()
            .await
            .map_err(|e| failed(format!("waiting for it: {e}")))?;
        if !status.success() {
            return Err(failed(format!("it exited with {status}")));
        }
        Ok(wav)
    };
    // On a timeout the child is dropped with the future: `kill_on_drop` ends it.
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| failed(format!("no audio within {timeout:?}")))?
}

/// A piece's WAV made ready for the carrier (on the blocking pool): its μ-law (the resampler's
/// tail too when it is the last), its word timings and its length. The resampler is made for
/// the first piece's rate (one per flite voice).
fn make(
    wav: &[u8],
    words: &[(String, f32)],
    out: &mut Option<(u32, UlawOut)>,
    offset_ms: f64,
    last: bool,
) -> Result<(Vec<u8>, Vec<WordTiming>, f64), TtsError> {
    let (rate, samples) = read_pcm16(wav).map_err(|e| failed(format!("its output: {e}")))?;
    if out.is_none() {
        *out = Some((rate, UlawOut::new(rate).map_err(failed)?));
    }
    let Some((first_rate, resampler)) = out.as_mut() else {
        return Err(failed("no resampler"));
    };
    if *first_rate != rate {
        return Err(failed(format!(
            "its audio changed from {first_rate} Hz to {rate} Hz within a sentence"
        )));
    }
    let mut ulaw = resampler.push_i16(&samples);
    if last {
        ulaw.extend(resampler.finish());
    }
    let timings = if samples.is_empty() {
        Vec::new()
    } else {
        let floats: Vec<f32> = samples.iter().map(|&s| f32::from(s) / 32768.0).collect();
        spread(words, voiced_span(&floats, rate), offset_ms)
    };
    Ok((
        ulaw,
        timings,
        samples.len() as f64 * 1000.0 / f64::from(rate),
    ))
}

async fn run(
    jobs: Vec<(tokio::process::Command, Vec<(String, f32)>)>,
    permits: Arc<Semaphore>,
    timestamps: bool,
    timeout: Duration,
    tx: &mpsc::Sender<TtsEvent>,
) -> Result<(), TtsError> {
    let mut out: Option<(u32, UlawOut)> = None;
    let mut offset_ms = 0.0f64;
    let count = jobs.len();
    for (i, (cmd, words)) in jobs.into_iter().enumerate() {
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| TtsError::Abandoned)?;
        let wav = run_one(cmd, timeout).await?;
        drop(permit);
        let last = i + 1 == count;
        let (ready, back) = tokio::task::spawn_blocking(move || {
            let r = make(&wav, &words, &mut out, offset_ms, last);
            (r, out)
        })
        .await
        .map_err(|e| failed(format!("the worker failed: {e}")))?;
        out = back;
        let (ulaw, timings, ms) = ready?;
        offset_ms += ms;
        if !ulaw.is_empty() {
            tx.send(TtsEvent::Audio(ulaw.into()))
                .await
                .map_err(|_| TtsError::Abandoned)?;
        }
        if timestamps && !timings.is_empty() {
            tx.send(TtsEvent::Words(timings))
                .await
                .map_err(|_| TtsError::Abandoned)?;
        }
    }
    Ok(())
}

impl super::kinds::TtsKindImpl for FliteTts {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(program: &str) -> TtsConfig {
        let mut c: TtsConfig =
            toml::from_str(&format!("kind = \"flite\"\nprogram = \"{program}\"")).expect("config");
        c.fill_kind_defaults();
        c
    }

    async fn events(tts: &FliteTts, text: &str) -> Vec<TtsEvent> {
        let mut s = tts.synthesize(text);
        let mut out = Vec::new();
        while let Some(e) = s.events.recv().await {
            out.push(e);
        }
        out
    }

    #[test]
    fn a_missing_program_is_refused_at_build() {
        let e = FliteTts::new(&cfg("/nonexistent/flite"))
            .err()
            .expect("refused");
        assert!(e.to_string().contains("apt-get install flite"), "{e}");
    }

    /// A program that fails, or writes something that is not a WAV, fails the sentence in a way
    /// a chain hands to its next TTS.
    #[tokio::test]
    async fn a_failing_or_babbling_program_makes_the_sentence_unavailable() {
        for (program, why) in [("/bin/false", "exited"), ("/bin/echo", "not a WAV")] {
            let tts = FliteTts::new(&cfg(program)).expect("tts");
            let evs = events(&tts, "Hello there, how are you?").await;
            match evs.as_slice() {
                [TtsEvent::Unavailable(m)] => assert!(m.contains(why), "{program}: {m}"),
                other => panic!("{program}: {other:?}"),
            }
        }
    }

    /// The real flite, when installed: μ-law 8 kHz of about the sentence's length, and word
    /// timings for every word, in order, within the audio.
    #[tokio::test]
    async fn flite_speaks_with_estimated_word_timings() {
        if crate::util::find_program("flite").is_none() {
            assert!(
                std::env::var("PATTERD_REQUIRE_LOCAL_SPEECH").as_deref() != Ok("1"),
                "PATTERD_REQUIRE_LOCAL_SPEECH=1 but flite is not installed"
            );
            eprintln!("SKIPPED: flite is not installed (apt-get install flite)");
            return;
        }
        let tts = FliteTts::new(&cfg("flite")).expect("tts");
        let text = "Sure, your order ships today, and it arrives on Friday.";
        let evs = events(&tts, text).await;
        assert_eq!(evs.last(), Some(&TtsEvent::Done), "{evs:?}");
        let bytes: usize = evs
            .iter()
            .map(|e| match e {
                TtsEvent::Audio(a) => a.len(),
                _ => 0,
            })
            .sum();
        let words: Vec<WordTiming> = evs
            .iter()
            .filter_map(|e| match e {
                TtsEvent::Words(w) => Some(w.clone()),
                _ => None,
            })
            .flatten()
            .collect();
        let ms = (bytes / 8) as u32;
        assert!((1500..6000).contains(&ms), "{ms} ms for 10 words");
        let said: Vec<&str> = words.iter().map(|w| w.word.as_str()).collect();
        assert_eq!(said, text.split_whitespace().collect::<Vec<_>>());
        assert!(words.windows(2).all(|p| p[0].end_ms <= p[1].start_ms + 1));
        assert!(words.last().is_some_and(|w| w.end_ms <= ms), "{words:?}");
        // The second piece starts after the first one's audio.
        let second = words.iter().find(|w| w.word == "and").expect("and");
        assert!(second.start_ms > 1000, "{second:?}");
    }
}
