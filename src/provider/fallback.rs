//! Fallback chains: an ordered list of providers of one kind where a failed one is skipped for
//! a cool-down and retried later. The generic part — [`Health`] (one per configured provider,
//! shared by every call, so one call's failure spares the next calls the wait), [`Member`] and
//! [`Chain::order`] — knows nothing about speech and can carry STT or LLM chains too;
//! [`Chain<dyn TtsProvider>`] is the text-to-speech chain, itself a [`TtsProvider`], and
//! `Chain<dyn SttProvider>` the speech-to-text chain ([`super::fallback_stt`]).
//!
//! The TTS chain switches only *before* a sentence's first audio byte: on a connect error, a
//! 5xx or 429 (a provider's [`TtsEvent::Unavailable`]) or when no audio came within
//! `first_byte_timeout`; the next provider then speaks that same sentence. Once audio has
//! started the provider keeps the sentence (never mid-sentence). Every switch is a
//! [`TtsEvent::Switched`] (a `tts_fallback` event on the call's timeline) and a count in
//! `patterd_tts_fallbacks_total`; every sentence's first audio is a [`TtsEvent::FirstByte`]
//! (the `tts_first_byte` stage latency).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{TtsEvent, TtsProvider, TtsStream};
use crate::util::TaskGuard;

/// Whether one configured provider is usable now. Shared by every chain that names it.
#[derive(Debug, Default)]
pub struct Health {
    down_until: Mutex<Option<Instant>>,
}

impl Health {
    /// True while the provider is cooling down after a failure.
    pub(crate) fn is_down(&self, now: Instant) -> bool {
        self.down_until
            .lock()
            .map(|d| d.is_some_and(|t| now < t))
            .unwrap_or(false)
    }

    /// Skips the provider until `now + cooldown`.
    pub(crate) fn mark_down(&self, now: Instant, cooldown: Duration) {
        if let Ok(mut d) = self.down_until.lock() {
            *d = Some(now + cooldown);
        }
    }

    /// The provider worked: no cool-down.
    pub(crate) fn mark_up(&self) {
        if let Ok(mut d) = self.down_until.lock() {
            *d = None;
        }
    }
}

/// One provider of a chain: its `[section.NAME]` name, the provider, its shared health.
pub(crate) struct Member<P: ?Sized> {
    pub name: String,
    pub provider: Arc<P>,
    pub health: Arc<Health>,
}

impl<P: ?Sized> Clone for Member<P> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            provider: self.provider.clone(),
            health: self.health.clone(),
        }
    }
}

/// An ordered chain of providers.
pub(crate) struct Chain<P: ?Sized> {
    members: Vec<Member<P>>,
    cooldown: Duration,
    first_byte_timeout: Duration,
    switches: Arc<AtomicU64>,
    /// The member whose work failed after it had started (an STT session dropped mid-call)
    /// and why: the chain's next run reports its switch away from it
    /// ([`super::fallback_stt`]).
    dropped: Arc<Mutex<Option<(String, String)>>>,
}

impl<P: ?Sized> Chain<P> {
    /// A chain over `members` (tried in this order). `switches` counts every switch.
    pub(crate) fn new(
        members: Vec<Member<P>>,
        cooldown: Duration,
        first_byte_timeout: Duration,
        switches: Arc<AtomicU64>,
    ) -> Self {
        Self {
            members,
            cooldown,
            first_byte_timeout,
            switches,
            dropped: Arc::default(),
        }
    }

    pub(crate) fn members(&self) -> &[Member<P>] {
        &self.members
    }

    /// How long a failed member is skipped.
    pub(crate) fn cooldown(&self) -> Duration {
        self.cooldown
    }

    /// The deadline a member gets to start (TTS: first audio byte; STT: session open).
    pub(crate) fn first_byte_timeout(&self) -> Duration {
        self.first_byte_timeout
    }

    /// The counter of switches.
    pub(crate) fn switches(&self) -> &Arc<AtomicU64> {
        &self.switches
    }

    pub(super) fn dropped(&self) -> &Arc<Mutex<Option<(String, String)>>> {
        &self.dropped
    }

    /// The members to try now, in order: those not cooling down in configured order, then
    /// (as a last resort, so something is always tried) those cooling down.
    pub(crate) fn order(&self, now: Instant) -> Vec<usize> {
        let (up, down): (Vec<usize>, Vec<usize>) =
            (0..self.members.len()).partition(|&i| !self.members[i].health.is_down(now));
        up.into_iter().chain(down).collect()
    }
}

impl TtsProvider for Chain<dyn TtsProvider> {
    fn synthesize(&self, text: &str) -> TtsStream {
        let (tx, rx) = mpsc::channel(64);
        let run = Run {
            members: self
                .order(Instant::now())
                .into_iter()
                .map(|i| self.members[i].clone())
                .collect(),
            cooldown: self.cooldown,
            first_byte_timeout: self.first_byte_timeout,
            switches: self.switches.clone(),
            text: text.to_string(),
        };
        let task = tokio::spawn(async move { run.go(tx).await });
        TtsStream {
            events: rx,
            guard: TaskGuard::new(task),
        }
    }
}

/// One sentence through a chain.
struct Run {
    members: Vec<Member<dyn TtsProvider>>,
    cooldown: Duration,
    first_byte_timeout: Duration,
    switches: Arc<AtomicU64>,
    text: String,
}

/// How one member's attempt at a sentence began.
enum Start {
    /// Audio came: the member keeps the sentence (with any word timings that came first).
    Audio(bytes::Bytes, Vec<TtsEvent>),
    /// Finished without audio (empty text): nothing to speak.
    Done,
    /// A failure the next member should not retry (a refused request).
    Fatal(String),
    /// A failure the next member may do better on.
    Switch(String),
}

impl Run {
    async fn go(self, tx: mpsc::Sender<TtsEvent>) {
        let started = Instant::now();
        let n = self.members.len();
        for (k, m) in self.members.iter().enumerate() {
            let has_next = k + 1 < n;
            let mut stream = m.provider.synthesize(&self.text);
            match self.first(&mut stream, has_next).await {
                Start::Audio(b, words) => {
                    m.health.mark_up();
                    let first = TtsEvent::FirstByte {
                        provider: m.name.clone(),
                        after: started.elapsed(),
                    };
                    if tx.send(first).await.is_err() || tx.send(TtsEvent::Audio(b)).await.is_err() {
                        return;
                    }
                    for w in words {
                        if tx.send(w).await.is_err() {
                            return;
                        }
                    }
                    // The rest of the sentence, whatever happens: never switch mid-sentence.
                    while let Some(ev) = stream.events.recv().await {
                        let ev = match ev {
                            TtsEvent::Unavailable(e) => TtsEvent::Error(e),
                            TtsEvent::FirstByte { .. } | TtsEvent::Switched { .. } => continue,
                            ev => ev,
                        };
                        let last = matches!(ev, TtsEvent::Done | TtsEvent::Error(_));
                        if tx.send(ev).await.is_err() || last {
                            return;
                        }
                    }
                    return;
                }
                Start::Done => {
                    m.health.mark_up();
                    let _ = tx.send(TtsEvent::Done).await;
                    return;
                }
                Start::Fatal(e) => {
                    let _ = tx.send(TtsEvent::Error(e)).await;
                    return;
                }
                Start::Switch(reason) if has_next => {
                    m.health.mark_down(Instant::now(), self.cooldown);
                    self.switches.fetch_add(1, Ordering::Relaxed);
                    let to = self.members[k + 1].name.clone();
                    tracing::warn!(from = %m.name, %to, %reason, "text-to-speech switched to the next of the chain");
                    let ev = TtsEvent::Switched {
                        from: m.name.clone(),
                        to,
                        reason,
                    };
                    if tx.send(ev).await.is_err() {
                        return;
                    }
                    // Dropping `stream` here cancels the failed attempt.
                }
                Start::Switch(reason) => {
                    if n > 1 {
                        m.health.mark_down(Instant::now(), self.cooldown);
                    }
                    let _ = tx.send(TtsEvent::Unavailable(reason)).await;
                    return;
                }
            }
        }
    }

    /// Waits for the attempt's first audio (within the deadline when a next member exists).
    async fn first(&self, stream: &mut TtsStream, has_next: bool) -> Start {
        let deadline = Instant::now() + self.first_byte_timeout;
        let mut words = Vec::new();
        loop {
            let ev = if has_next {
                match tokio::time::timeout_at(deadline, stream.events.recv()).await {
                    Ok(ev) => ev,
                    Err(_) => {
                        return Start::Switch(format!(
                            "no audio within {} ms",
                            self.first_byte_timeout.as_millis()
                        ));
                    }
                }
            } else {
                stream.events.recv().await
            };
            match ev {
                Some(TtsEvent::Audio(b)) if b.is_empty() => {}
                Some(TtsEvent::Audio(b)) => return Start::Audio(b, words),
                Some(w @ TtsEvent::Words(_)) => words.push(w),
                Some(TtsEvent::Done) => return Start::Done,
                Some(TtsEvent::Error(e)) => return Start::Fatal(e),
                Some(TtsEvent::Unavailable(e)) => return Start::Switch(e),
                Some(TtsEvent::FirstByte { .. } | TtsEvent::Switched { .. }) => {}
                None => return Start::Switch("the synthesis ended without audio".into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// A scripted TTS: each synthesis plays `script` (None = never answers).
    struct Scripted(Option<Vec<TtsEvent>>, Arc<AtomicU64>);

    impl TtsProvider for Scripted {
        fn synthesize(&self, _text: &str) -> TtsStream {
            self.1.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = mpsc::channel(16);
            let script = self.0.clone();
            let task = tokio::spawn(async move {
                match script {
                    Some(evs) => {
                        for e in evs {
                            let _ = tx.send(e).await;
                        }
                    }
                    None => std::future::pending::<()>().await,
                }
            });
            TtsStream {
                events: rx,
                guard: TaskGuard::new(task),
            }
        }
    }

    fn member(
        name: &str,
        script: Option<Vec<TtsEvent>>,
    ) -> (Member<dyn TtsProvider>, Arc<AtomicU64>) {
        let calls = Arc::new(AtomicU64::new(0));
        let p: Arc<dyn TtsProvider> = Arc::new(Scripted(script, calls.clone()));
        (
            Member {
                name: name.into(),
                provider: p,
                health: Arc::new(Health::default()),
            },
            calls,
        )
    }

    fn ok() -> Option<Vec<TtsEvent>> {
        Some(vec![
            TtsEvent::Audio(Bytes::from_static(&[1, 2])),
            TtsEvent::Audio(Bytes::from_static(&[3])),
            TtsEvent::Done,
        ])
    }

    async fn all(mut s: TtsStream) -> Vec<TtsEvent> {
        let mut v = Vec::new();
        while let Some(e) = s.events.recv().await {
            v.push(e);
        }
        v
    }

    fn chain(members: Vec<Member<dyn TtsProvider>>) -> (Chain<dyn TtsProvider>, Arc<AtomicU64>) {
        let switches = Arc::new(AtomicU64::new(0));
        (
            Chain::new(
                members,
                Duration::from_secs(30),
                Duration::from_millis(100),
                switches.clone(),
            ),
            switches,
        )
    }

    #[tokio::test]
    async fn a_stalled_primary_hands_the_sentence_to_the_backup_and_cools_down() {
        let (a, a_calls) = member("a", None);
        let (b, b_calls) = member("b", ok());
        let health_a = a.health.clone();
        let (c, switches) = chain(vec![a, b]);
        let evs = all(c.synthesize("Hi.")).await;
        assert!(
            matches!(&evs[0], TtsEvent::Switched { from, to, reason } if from == "a" && to == "b" && reason.contains("100 ms")),
            "{evs:?}"
        );
        assert!(
            matches!(&evs[1], TtsEvent::FirstByte { provider, after } if provider == "b" && *after >= Duration::from_millis(100))
        );
        assert_eq!(evs[2], TtsEvent::Audio(Bytes::from_static(&[1, 2])));
        assert_eq!(evs.last(), Some(&TtsEvent::Done));
        assert_eq!(switches.load(Ordering::Relaxed), 1);
        assert!(health_a.is_down(Instant::now()));
        // The next sentence skips the cooling primary.
        let evs = all(c.synthesize("Again.")).await;
        assert!(matches!(&evs[0], TtsEvent::FirstByte { provider, .. } if provider == "b"));
        assert_eq!(a_calls.load(Ordering::Relaxed), 1);
        assert_eq!(b_calls.load(Ordering::Relaxed), 2);
        // After the cool-down the primary is tried first again.
        assert_eq!(c.order(Instant::now()), vec![1, 0]);
        assert_eq!(
            c.order(Instant::now() + Duration::from_secs(31)),
            vec![0, 1]
        );
    }

    #[tokio::test]
    async fn only_unavailable_switches_a_refused_request_does_not() {
        let (a, _) = member("a", Some(vec![TtsEvent::Unavailable("HTTP 500".into())]));
        let (b, _) = member("b", ok());
        let (c, _) = chain(vec![a, b]);
        let evs = all(c.synthesize("Hi.")).await;
        assert!(matches!(&evs[0], TtsEvent::Switched { reason, .. } if reason == "HTTP 500"));
        assert_eq!(evs.last(), Some(&TtsEvent::Done));

        let (a, _) = member("a", Some(vec![TtsEvent::Error("HTTP 422".into())]));
        let (b, b_calls) = member("b", ok());
        let (c, switches) = chain(vec![a, b]);
        let evs = all(c.synthesize("Hi.")).await;
        assert_eq!(evs, vec![TtsEvent::Error("HTTP 422".into())]);
        assert_eq!(b_calls.load(Ordering::Relaxed), 0);
        assert_eq!(switches.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_failure_after_audio_started_is_never_switched() {
        let (a, _) = member(
            "a",
            Some(vec![
                TtsEvent::Audio(Bytes::from_static(&[9])),
                TtsEvent::Unavailable("stream broke".into()),
            ]),
        );
        let (b, b_calls) = member("b", ok());
        let (c, _) = chain(vec![a, b]);
        let evs = all(c.synthesize("Hi.")).await;
        assert!(matches!(&evs[0], TtsEvent::FirstByte { provider, .. } if provider == "a"));
        assert_eq!(evs[1], TtsEvent::Audio(Bytes::from_static(&[9])));
        assert_eq!(evs[2], TtsEvent::Error("stream broke".into()));
        assert_eq!(b_calls.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn when_all_are_cooling_they_are_still_tried_in_order() {
        let (a, _) = member("a", ok());
        let (b, _) = member("b", ok());
        let now = Instant::now();
        a.health.mark_down(now, Duration::from_secs(30));
        b.health.mark_down(now, Duration::from_secs(10));
        let (c, _) = chain(vec![a, b]);
        assert_eq!(c.order(now), vec![0, 1]);
        assert_eq!(c.order(now + Duration::from_secs(11)), vec![1, 0]);
    }
}
