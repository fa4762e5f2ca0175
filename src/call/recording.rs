//! Call recordings (`[agents.X] record = true`): a stereo 16-bit PCM WAV at 8 kHz per call,
//! the caller on the left and the agent on the right, at `data_dir/recordings/<call_id>.wav`.
//! The actor hands each frame to a [`Recorder`] (a `try_send` on a bounded channel; what does
//! not fit is dropped and counted) and a writer on a blocking thread does the decoding and the
//! file I/O. Both tracks are placed in time from the recording's start: caller audio when it
//! arrived (right after the previous caller frame when it came within [`JITTER`] of its end),
//! agent audio when it was sent to the carrier (after the agent audio already placed, as the
//! carrier plays it); a barge-in `clear` withdraws the agent audio placed after it, which
//! the caller never heard. Caller audio is never placed more than [`JITTER`] ahead of the
//! newest sample (a caller that sends faster than real time does not stretch the recording:
//! the frames that would run ahead are dropped), and nothing is buffered past [`CAP`] after
//! the samples written (what would be is dropped and counted). Audio older than [`HORIZON`]
//! is final and written out as the call goes, so the writer holds seconds, never the call;
//! the RIFF sizes are filled in when the call ends (the file is written as
//! `<call_id>.wav.part` and renamed when complete; [`prune_parts`] removes the parts a crash
//! left). A recording is readable by its owner only (0600, in a 0700 directory): it is the
//! caller's voice.

use std::collections::VecDeque;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::warn;

use crate::audio::g711;

/// Frames queued to the writer (both tracks: about five seconds of a two-way call).
const QUEUE: usize = 512;
/// Samples per second.
const RATE: u64 = 8000;
/// Audio this far behind the latest frame can no longer change (agent audio runs at most a
/// second ahead of real time; a `clear` only withdraws audio after now).
const HORIZON: u64 = 3 * RATE;
/// Caller frames arriving this little after the previous one ended follow it directly (network
/// jitter); a later one leaves a gap (the carrier sent nothing meanwhile).
const JITTER: u64 = 480;
/// Samples buffered at most after those written: the [`HORIZON`] twice (what waits to be
/// written) and two seconds of agent audio sent ahead or caller jitter.
const CAP: u64 = 2 * HORIZON + 2 * RATE;
/// Bytes of the WAV header written before the samples.
const HEADER: u64 = 44;

/// Where a call's recording lives; `None` for a call id that is not a safe file name (ids are
/// letters, digits and `-_.:`, as carriers make them; Telnyx ids contain `:`).
pub fn path(data_dir: &Path, call_id: &str) -> Option<PathBuf> {
    let safe = !call_id.is_empty()
        && call_id.len() <= 128
        && call_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.' || b == b':')
        && !call_id.starts_with('.');
    safe.then(|| data_dir.join("recordings").join(format!("{call_id}.wav")))
}

/// Removes the `<call_id>.wav.part` files under `data_dir/recordings` (a crash's unfinished
/// recordings: never served, never finished, otherwise never deleted); run at start, when
/// no call is live. Returns how many were removed (logged when any).
pub fn prune_parts(data_dir: &Path) -> usize {
    let dir = data_dir.join("recordings");
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return 0,
        Err(e) => {
            warn!(path = %dir.display(), error = %e, "could not list the recordings to remove unfinished ones");
            return 0;
        }
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let is_part = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with(".wav.part"));
        if !is_part || !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => removed += 1,
            Err(e) => {
                warn!(path = %path.display(), error = %e, "could not remove an unfinished recording")
            }
        }
    }
    if removed > 0 {
        tracing::info!(
            removed,
            "removed unfinished recordings (.wav.part) left by an earlier run"
        );
    }
    removed
}

/// One message to the writer. Times are in samples since the recording started.
#[derive(Debug)]
enum Msg {
    Caller {
        at: u64,
        frame: Bytes,
    },
    Agent {
        at: u64,
        frame: Bytes,
    },
    /// A `clear`: agent audio placed at or after `at` was never played.
    Clear {
        at: u64,
    },
}

/// The actor's end of a recording. Dropping it finalises the file.
pub struct Recorder {
    tx: mpsc::Sender<Msg>,
    start: Instant,
}

impl Recorder {
    /// Starts recording to `path` now (the writer creates the file on its thread); `ready`
    /// is told the file's size once it is complete.
    pub fn start(path: PathBuf, ready: Option<Box<dyn FnOnce(u64) + Send>>) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::task::spawn_blocking(move || match write(&path, rx) {
            Ok(()) => {
                if let Some(ready) = ready {
                    ready(std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0));
                }
            }
            Err(e) => {
                warn!(path = %path.display(), error = %e, "the call's recording could not be written; check that data_dir is writable");
            }
        });
        Self {
            tx,
            start: Instant::now(),
        }
    }

    fn now(&self) -> u64 {
        (self.start.elapsed().as_micros() as u64) * RATE / 1_000_000
    }

    /// Caller audio (μ-law) that arrived now. False when it was dropped (the queue is full).
    pub fn caller(&self, frame: Bytes) -> bool {
        let at = self.now();
        self.tx.try_send(Msg::Caller { at, frame }).is_ok()
    }

    /// The caller's side, for whoever reads the media socket ([`super::ingress`]). It does
    /// not keep the recording open: once this `Recorder` is dropped the file is finished and
    /// caller frames are refused.
    pub(crate) fn caller_track(&self) -> CallerTrack {
        CallerTrack {
            tx: self.tx.downgrade(),
            start: self.start,
        }
    }

    /// Agent audio (μ-law) sent to the carrier now. False when it was dropped.
    pub fn agent(&self, frame: Bytes) -> bool {
        let at = self.now();
        self.tx.try_send(Msg::Agent { at, frame }).is_ok()
    }

    /// The carrier was told to `clear` now. False when it was dropped.
    pub fn clear(&self) -> bool {
        let at = self.now();
        self.tx.try_send(Msg::Clear { at }).is_ok()
    }
}

/// The caller's side of a [`Recorder`] (see [`Recorder::caller_track`]).
pub(crate) struct CallerTrack {
    tx: mpsc::WeakSender<Msg>,
    start: Instant,
}

impl CallerTrack {
    /// Caller audio (μ-law) that arrived now. False when it was dropped (the queue is full or
    /// the recording is finished).
    pub(crate) fn caller(&self, frame: Bytes) -> bool {
        let at = (self.start.elapsed().as_micros() as u64) * RATE / 1_000_000;
        self.tx
            .upgrade()
            .is_some_and(|tx| tx.try_send(Msg::Caller { at, frame }).is_ok())
    }
}

/// Both tracks from sample `written` on, not yet final.
#[derive(Default)]
struct Tracks {
    written: u64,
    left: VecDeque<i16>,
    right: VecDeque<i16>,
    /// Where the next caller / agent frame goes at the earliest.
    caller_end: u64,
    agent_end: u64,
    latest: u64,
    /// Samples of caller audio dropped because they would have run more than [`JITTER`]
    /// ahead of the newest sample, and samples of either track dropped at [`CAP`].
    caller_ahead: u64,
    capped: u64,
}

impl Tracks {
    fn grow(&mut self, end: u64) {
        let len = end.saturating_sub(self.written) as usize;
        if self.left.len() < len {
            self.left.resize(len, 0);
            self.right.resize(len, 0);
        }
    }

    /// Places `frame` at `at` on one track; false (nothing placed) when it would end past
    /// [`CAP`] after the samples written.
    fn place(&mut self, right: bool, at: u64, frame: &[u8]) -> bool {
        let end = at + frame.len() as u64;
        if end > self.written + CAP {
            self.capped += frame.len() as u64;
            return false;
        }
        self.grow(end);
        let track = if right {
            &mut self.right
        } else {
            &mut self.left
        };
        for (i, b) in frame.iter().enumerate() {
            let t = at + i as u64;
            if t >= self.written {
                track[(t - self.written) as usize] = g711::ulaw_to_linear(*b);
            }
        }
        true
    }

    fn apply(&mut self, msg: Msg) {
        match msg {
            Msg::Caller { at, frame } => {
                self.latest = self.latest.max(at);
                let at = if at <= self.caller_end + JITTER {
                    self.caller_end
                } else {
                    at
                };
                // Audio sent faster than real time would run ahead of the clock.
                if at > self.latest + JITTER {
                    self.caller_ahead += frame.len() as u64;
                    return;
                }
                if self.place(false, at, &frame) {
                    self.caller_end = at + frame.len() as u64;
                }
            }
            Msg::Agent { at, frame } => {
                self.latest = self.latest.max(at);
                let at = at.max(self.agent_end);
                if self.place(true, at, &frame) {
                    self.agent_end = at + frame.len() as u64;
                }
            }
            Msg::Clear { at } => {
                self.latest = self.latest.max(at);
                let from = at.saturating_sub(self.written) as usize;
                for s in self.right.iter_mut().skip(from) {
                    *s = 0;
                }
                self.agent_end = self.agent_end.min(at);
            }
        }
    }

    /// Takes the samples before `until` (interleaved, little-endian).
    fn take(&mut self, until: u64, out: &mut Vec<u8>) {
        let n = (until.saturating_sub(self.written) as usize).min(self.left.len());
        out.clear();
        for (l, r) in self.left.drain(..n).zip(self.right.drain(..n)) {
            out.extend_from_slice(&l.to_le_bytes());
            out.extend_from_slice(&r.to_le_bytes());
        }
        self.written += n as u64;
    }
}

/// The WAV header for `samples` stereo frames.
fn header(samples: u64) -> [u8; HEADER as usize] {
    let data = u32::try_from(samples * 4).unwrap_or(u32::MAX - 36);
    let mut h = [0u8; HEADER as usize];
    let mut w = &mut h[..];
    let parts: [&[u8]; 12] = [
        b"RIFF",
        &(data + 36).to_le_bytes(),
        b"WAVEfmt ",
        &16u32.to_le_bytes(),
        &1u16.to_le_bytes(),
        &2u16.to_le_bytes(),
        &(RATE as u32).to_le_bytes(),
        &(RATE as u32 * 4).to_le_bytes(),
        &4u16.to_le_bytes(),
        &16u16.to_le_bytes(),
        b"data",
        &data.to_le_bytes(),
    ];
    for p in parts {
        let _ = w.write_all(p);
    }
    h
}

/// The writer: runs on a blocking thread until the [`Recorder`] is dropped.
/// It writes `<call_id>.wav.part` and renames it to `<call_id>.wav` once finalised, so a
/// recording that can be served is always complete.
fn write(path: &Path, mut rx: mpsc::Receiver<Msg>) -> std::io::Result<()> {
    write_msgs(path, std::iter::from_fn(move || rx.blocking_recv()))
}

/// The writer's whole work for a call whose caller sent `caller` and whose agent sent `agent`
/// (μ-law, both from the start, one 20 ms frame each per 20 ms): what `cargo bench --bench
/// hot_path -- recording` measures.
pub fn write_call(path: &Path, caller: &[u8], agent: &[u8]) -> std::io::Result<()> {
    let frames = caller.len().max(agent.len()).div_ceil(160);
    let msgs = (0..frames).flat_map(move |i| {
        let at = i as u64 * 160;
        let slice = |a: &[u8]| {
            Bytes::copy_from_slice(a.get(i * 160..((i + 1) * 160).min(a.len())).unwrap_or(&[]))
        };
        [
            Msg::Caller {
                at,
                frame: slice(caller),
            },
            Msg::Agent {
                at,
                frame: slice(agent),
            },
        ]
    });
    write_msgs(path, msgs.collect::<Vec<_>>().into_iter())
}

fn write_msgs(path: &Path, msgs: impl Iterator<Item = Msg>) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        crate::util::create_private_dir(dir)?;
    }
    let part = path.with_extension("wav.part");
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&part)?
    };
    let mut file = BufWriter::new(file);
    file.write_all(&header(0))?;
    let mut tracks = Tracks::default();
    let mut buf = Vec::new();
    for msg in msgs {
        tracks.apply(msg);
        if tracks.latest >= tracks.written + 2 * HORIZON {
            tracks.take(tracks.latest - HORIZON, &mut buf);
            file.write_all(&buf)?;
        }
    }
    tracks.take(u64::MAX, &mut buf);
    file.write_all(&buf)?;
    if tracks.caller_ahead > 0 || tracks.capped > 0 {
        warn!(
            caller_ahead_ms = tracks.caller_ahead / 8,
            capped_ms = tracks.capped / 8,
            "the recording dropped audio that ran ahead of real time"
        );
    }
    let samples = tracks.written;
    let mut file = file.into_inner().map_err(|e| e.into_error())?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(&header(samples))?;
    file.sync_data()?;
    drop(file);
    std::fs::rename(&part, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(byte: u8) -> Bytes {
        Bytes::from(vec![byte; 160])
    }

    #[test]
    fn tracks_place_agent_audio_after_what_was_sent_and_clear_withdraws_it() {
        let mut t = Tracks::default();
        // Three agent frames sent at once play one after another.
        for _ in 0..3 {
            t.apply(Msg::Agent {
                at: 0,
                frame: frame(0x00),
            });
        }
        // A clear at 200 samples withdraws the rest of the second frame and the third.
        t.apply(Msg::Clear { at: 200 });
        // A caller frame within the jitter follows the previous one; a later one leaves a gap.
        t.apply(Msg::Caller {
            at: 100,
            frame: frame(0x80),
        });
        t.apply(Msg::Caller {
            at: 1000,
            frame: frame(0x80),
        });
        let mut out = Vec::new();
        t.take(u64::MAX, &mut out);
        let right: Vec<i16> = out
            .chunks(4)
            .map(|c| i16::from_le_bytes([c[2], c[3]]))
            .collect();
        let left: Vec<i16> = out
            .chunks(4)
            .map(|c| i16::from_le_bytes([c[0], c[1]]))
            .collect();
        let loud = g711::ulaw_to_linear(0x00);
        let caller = g711::ulaw_to_linear(0x80);
        assert_eq!(right.len(), 1160);
        assert!(right[..200].iter().all(|s| *s == loud));
        assert!(right[200..].iter().all(|s| *s == 0));
        assert!(left[..160].iter().all(|s| *s == caller));
        assert!(left[160..1000].iter().all(|s| *s == 0));
        assert!(left[1000..].iter().all(|s| *s == caller));
        // The next agent frame starts at the clear, not after the withdrawn audio.
        t.apply(Msg::Agent {
            at: 0,
            frame: frame(0x00),
        });
        assert_eq!(t.agent_end, 200 + 160);
        assert_eq!(t.written, 1160);
    }

    /// A caller flooding the socket (frames arriving far faster than they play): the
    /// recording places its audio no more than the jitter allowance ahead of the newest
    /// sample and drops the rest, so the recording is as long as the call, not as the flood.
    #[test]
    fn caller_audio_never_runs_ahead_of_the_clock() {
        let mut t = Tracks::default();
        // One second of the clock, 50 frames of one second of audio arriving every 20 ms.
        for ms in (0..1000u64).step_by(20) {
            for _ in 0..50 {
                t.apply(Msg::Caller {
                    at: ms * 8,
                    frame: frame(0x80),
                });
            }
            assert!(
                t.caller_end <= t.latest + JITTER + 160,
                "placed up to {} at {}",
                t.caller_end,
                t.latest
            );
        }
        assert!(t.left.len() as u64 <= t.latest + JITTER + 160);
        // 50 s of audio sent; a second and the allowance kept.
        assert!(t.caller_ahead >= 48 * RATE, "{}", t.caller_ahead);
        // A frame within the jitter of the last one still follows it directly.
        let end = t.caller_end;
        t.apply(Msg::Caller {
            at: end + 100,
            frame: frame(0x80),
        });
        assert_eq!(t.caller_end, end + 160);
    }

    /// Whatever is sent, the writer buffers at most [`CAP`] samples past those written:
    /// agent audio sent minutes ahead (a runaway pacer) is dropped and counted.
    #[test]
    fn what_the_writer_buffers_is_capped() {
        let mut t = Tracks::default();
        for _ in 0..10_000 {
            t.apply(Msg::Agent {
                at: 0,
                frame: frame(0x00),
            });
        }
        assert!(t.left.len() as u64 <= CAP && t.right.len() as u64 <= CAP);
        assert_eq!(t.agent_end, CAP);
        assert_eq!(t.capped, (10_000 - CAP / 160) * 160);
    }

    /// The WAV goes to disk as the call goes (its `.part` grows while the writer holds only
    /// the last seconds), then gets its sizes and its name.
    #[test]
    fn the_wav_is_streamed_to_disk_as_the_call_goes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wav = path(dir.path(), "CA1").expect("path");
        let part = wav.with_extension("wav.part");
        // 60 s of a call: a caller and an agent frame every 20 ms; the part's size is read
        // every 10 s of it, while the writer runs.
        let seen = std::cell::RefCell::new(Vec::new());
        let msgs = (0..3000u64).flat_map(|i| {
            if i % 500 == 0 {
                let size = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
                seen.borrow_mut().push(size);
            }
            [
                Msg::Caller {
                    at: i * 160,
                    frame: frame(0x80),
                },
                Msg::Agent {
                    at: i * 160,
                    frame: frame(0x00),
                },
            ]
        });
        write_msgs(&wav, msgs).expect("written");
        let seen = seen.into_inner();
        assert_eq!(seen.len(), 6);
        // Growing during the call, each time within the writer's horizon of the whole so far.
        assert!(seen.windows(2).all(|w| w[1] > w[0]), "{seen:?}");
        for (k, size) in seen.iter().enumerate().skip(1) {
            let so_far = HEADER + k as u64 * 10 * RATE * 4;
            assert!(*size + (2 * HORIZON + RATE) * 4 >= so_far, "{seen:?}");
        }
        assert!(!part.exists());
        let len = std::fs::metadata(&wav).expect("wav").len();
        assert_eq!(len, HEADER + 3000 * 160 * 4);
        let bytes = std::fs::read(&wav).expect("read");
        assert_eq!(
            u32::from_le_bytes([bytes[40], bytes[41], bytes[42], bytes[43]]) as u64,
            len - HEADER
        );
    }

    #[test]
    fn recordings_and_their_directory_are_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let wav = path(&data, "CA1").expect("path");
        write_call(&wav, &[0xFF; 320], &[0xFF; 320]).expect("written");
        let mode = |p: &Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
        assert_eq!(mode(&wav), 0o600);
        assert_eq!(mode(wav.parent().expect("recordings")), 0o700);
        assert_eq!(mode(&data), 0o700);
    }

    #[test]
    fn unsafe_call_ids_get_no_path() {
        let dir = Path::new("/d");
        assert_eq!(
            path(dir, "CA12_ab-c"),
            Some(PathBuf::from("/d/recordings/CA12_ab-c.wav"))
        );
        assert_eq!(path(dir, "../x"), None);
        assert_eq!(path(dir, "a/b"), None);
        assert_eq!(path(dir, ""), None);
    }
}
