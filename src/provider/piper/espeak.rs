//! espeak-ng as a long-lived child process turning text into IPA phonemes for Piper:
//! `espeak-ng -q --ipa -b 1 -v VOICE` reads its standard input one line at a time and writes
//! each line's phonemes (one output line per clause it hears) and flushes, so one process
//! serves every sentence. espeak-ng is GPL-3.0-or-later: it is run as a separate program, never
//! linked. A line may come back as several (espeak-ng ends a clause at `Dr.` too), so each
//! request is followed by a sentinel word whose phonemes, learnt when the process starts, mark
//! the end of the answer. A process that dies, hangs past the deadline or answers garbage is
//! killed and a new one started on the next request. Blocking: called from the Piper worker
//! pool, never on the runtime's threads.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, sync_channel};
use std::time::{Duration, Instant};

/// The word sent after each request; removed from the text itself.
const SENTINEL: &str = "qzxjv";

/// The longest input line (bytes): espeak-ng reads lines of up to 1000 bytes, and the clauses
/// given to it are at most 300.
const MAX_LINE_BYTES: usize = 900;

/// Why espeak-ng could not phonemize a clause.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EspeakError {
    #[error(
        "cannot start {program}: {source}; install espeak-ng (`apt-get install espeak-ng`) or \
         set [tts] program to its path"
    )]
    Start {
        program: String,
        source: std::io::Error,
    },
    #[error("{program} did not answer within {after:?}")]
    Timeout { program: String, after: Duration },
    #[error("{program} exited")]
    Exited { program: String },
    #[error("{program}: {message}")]
    Io { program: String, message: String },
}

/// A running espeak-ng.
struct Running {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    /// The sentinel's phonemes: the line that ends an answer.
    sentinel: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One espeak-ng process for one voice, restarted when it fails.
pub(crate) struct Espeak {
    program: String,
    voice: String,
    timeout: Duration,
    running: Option<Running>,
}

impl Espeak {
    /// Starts espeak-ng at once, so a missing program stops the daemon at start.
    pub(crate) fn start(
        program: &str,
        voice: &str,
        timeout: Duration,
    ) -> Result<Self, EspeakError> {
        let mut e = Self {
            program: program.to_string(),
            voice: voice.to_string(),
            timeout,
            running: None,
        };
        e.running = Some(e.spawn()?);
        Ok(e)
    }

    fn spawn(&self) -> Result<Running, EspeakError> {
        let mut child = Command::new(&self.program)
            .args(["-q", "--ipa", "-b", "1", "-v", &self.voice])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| EspeakError::Start {
                program: self.program.clone(),
                source,
            })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(self.io("no pipes to the child"));
        };
        // One reader thread per process: lines arrive on a bounded channel the blocking caller
        // waits on with a deadline. It ends when the process's output closes.
        let (tx, lines) = sync_channel(256);
        std::thread::Builder::new()
            .name("espeak-ng-out".into())
            .spawn(move || {
                let mut out = BufReader::new(stdout);
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    match out.read_until(b'\n', &mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {
                            let line = String::from_utf8_lossy(&buf).trim_end().to_string();
                            if tx.send(line).is_err() {
                                return;
                            }
                        }
                    }
                }
            })
            .map_err(|e| self.io(&format!("cannot start its reader thread: {e}")))?;
        let mut running = Running {
            child,
            stdin,
            lines,
            sentinel: String::new(),
        };
        // Learn the sentinel's phonemes: its whole answer is one line.
        writeln!(running.stdin, "{SENTINEL}")
            .and_then(|()| running.stdin.flush())
            .map_err(|e| self.io(&e.to_string()))?;
        let deadline = Instant::now() + self.timeout;
        running.sentinel = self.next_line(&running, deadline)?;
        if running.sentinel.is_empty() {
            return Err(self.io("it said nothing for a test word (is the voice installed?)"));
        }
        Ok(running)
    }

    fn io(&self, message: &str) -> EspeakError {
        EspeakError::Io {
            program: self.program.clone(),
            message: message.to_string(),
        }
    }

    fn next_line(&self, running: &Running, deadline: Instant) -> Result<String, EspeakError> {
        let left = deadline.saturating_duration_since(Instant::now());
        running.lines.recv_timeout(left).map_err(|e| match e {
            RecvTimeoutError::Timeout => EspeakError::Timeout {
                program: self.program.clone(),
                after: self.timeout,
            },
            RecvTimeoutError::Disconnected => EspeakError::Exited {
                program: self.program.clone(),
            },
        })
    }

    /// The phoneme lines espeak-ng gives for `text` (one per clause it hears; empty for text
    /// with nothing to say). A failure kills the process; the next call starts another.
    pub(crate) fn phonemize(&mut self, text: &str) -> Result<Vec<String>, EspeakError> {
        let line = input_line(text);
        if self.running.is_none() {
            self.running = Some(self.spawn()?);
        }
        let result = self.ask(&line);
        if result.is_err() {
            self.running = None;
        }
        result
    }

    fn ask(&mut self, line: &str) -> Result<Vec<String>, EspeakError> {
        let Some(running) = self.running.as_mut() else {
            return Err(self.io("not running"));
        };
        // Nothing is pending between requests; anything left over belongs to no one.
        while running.lines.try_recv().is_ok() {}
        write!(running.stdin, "{line}\n{SENTINEL}\n")
            .and_then(|()| running.stdin.flush())
            .map_err(|e| EspeakError::Io {
                program: self.program.clone(),
                message: e.to_string(),
            })?;
        let running = self
            .running
            .as_ref()
            .ok_or_else(|| self.io("not running"))?;
        let deadline = Instant::now() + self.timeout;
        let mut out = Vec::new();
        loop {
            let l = self.next_line(running, deadline)?;
            if l == running.sentinel {
                return Ok(out);
            }
            if out.len() >= 64 {
                return Err(self.io("too many lines for one clause"));
            }
            out.push(l);
        }
    }
}

/// `text` as one input line: no control characters (a newline would split the request), no
/// sentinel word, at most [`MAX_LINE_BYTES`].
fn input_line(text: &str) -> String {
    let mut line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    while let Some(at) = line.to_ascii_lowercase().find(SENTINEL) {
        line.replace_range(at..at + SENTINEL.len(), " ");
    }
    if line.len() > MAX_LINE_BYTES {
        let mut cut = MAX_LINE_BYTES;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_lines_cannot_split_or_end_a_request() {
        assert_eq!(input_line("a\nb\tc"), "a b c");
        assert_eq!(input_line("say QZXJV now"), "say   now");
        let long = "é".repeat(600);
        let l = input_line(&long);
        assert!(l.len() <= MAX_LINE_BYTES && l.chars().all(|c| c == 'é'));
    }

    /// espeak-ng itself, when installed: clauses and abbreviations come back as several lines,
    /// every answer ends at the sentinel, and a process that dies is replaced.
    #[test]
    fn espeak_ng_answers_line_by_line_and_restarts() {
        let Some(program) = crate::util::find_program("espeak-ng") else {
            assert!(
                std::env::var("PATTERD_REQUIRE_LOCAL_SPEECH").as_deref() != Ok("1"),
                "PATTERD_REQUIRE_LOCAL_SPEECH=1 but espeak-ng is not installed"
            );
            eprintln!("SKIPPED: espeak-ng is not installed (apt-get install espeak-ng)");
            return;
        };
        let program = program.display().to_string();
        let mut e = Espeak::start(&program, "en-us", Duration::from_secs(10)).expect("espeak-ng");
        let lines = e.phonemize("Dr. Smith is here").expect("phonemes");
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[1].contains("smˈɪθ"), "{lines:?}");
        assert_eq!(e.phonemize("...").expect("phonemes").concat(), "");
        let one = e.phonemize("I can help with that").expect("phonemes");
        assert_eq!(one.len(), 1, "{one:?}");
        if let Some(r) = e.running.as_mut() {
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
        assert!(e.phonemize("hello").is_err(), "the dead process fails once");
        assert_eq!(e.phonemize("I can help with that").expect("restarted"), one);
        let missing = Espeak::start("/nonexistent/espeak-ng", "en-us", Duration::from_secs(1));
        assert!(matches!(missing, Err(EspeakError::Start { .. })));
    }
}
