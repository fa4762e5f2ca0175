//! The speech-to-text fallback chain: `Chain<dyn SttProvider>` ([`super::fallback::Chain`],
//! the same chain type and shared per-provider [`super::fallback::Health`] as TTS) is itself
//! an [`SttProvider`], made per call for `stt = ["deepgram", "assemblyai"]`. Opening it opens
//! its members in order (those cooling down last) until one's session opens
//! ([`SttEvent::Connected`]): a member whose opening fails — connection refused, handshake
//! answered 4xx/5xx, the provider's error before the session opened — or that has not opened
//! within the connect deadline (`stt_connect_timeout_ms`, only when a next member exists) is
//! skipped for the cool-down and the next one is opened. Caller audio that arrives meanwhile
//! is kept (up to [`BUFFER_FRAMES`]) and given to the member that opens. Every switch is an
//! [`SttEvent::Switched`] (an `stt_switched` event on the call's timeline, counted in
//! `patterd_stt_switches_total`).
//!
//! A member whose session drops mid-call (a fatal error or a close we did not ask for) is put
//! on cool-down too and remembered: when the call reopens its STT through the same chain, the
//! next member serves and the switch is reported with reason [`SttSwitchReason::Dropped`].

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::fallback::{Chain, Member};
use super::{SttContext, SttEvent, SttInput, SttProvider, SttStream};
use crate::util::TaskGuard;

/// Caller frames kept while the chain is still opening a session (10 s of 20 ms frames).
pub(crate) const BUFFER_FRAMES: usize = 500;
const INPUT_QUEUE: usize = 1024;

/// Why an STT chain moved to its next member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SttSwitchReason {
    /// Opening failed: connection refused, the handshake was answered with an error status,
    /// or the provider refused the session before it opened.
    OpenFailed,
    /// The session had not opened within the connect deadline.
    OpenTimeout,
    /// The session dropped mid-call; the reopen went to the next member.
    Dropped,
}

impl SttSwitchReason {
    pub const ALL: [SttSwitchReason; 3] = [
        SttSwitchReason::OpenFailed,
        SttSwitchReason::OpenTimeout,
        SttSwitchReason::Dropped,
    ];

    /// The label in events and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            SttSwitchReason::OpenFailed => "open_failed",
            SttSwitchReason::OpenTimeout => "open_timeout",
            SttSwitchReason::Dropped => "dropped",
        }
    }
}

impl std::fmt::Display for SttSwitchReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl SttProvider for Chain<dyn SttProvider> {
    fn open(&self, ctx: &SttContext) -> SttStream {
        let (in_tx, in_rx) = mpsc::channel(INPUT_QUEUE);
        let (ev_tx, ev_rx) = mpsc::channel(256);
        let run = Run {
            members: self
                .order(Instant::now())
                .into_iter()
                .map(|i| self.members()[i].clone())
                .collect(),
            cooldown: self.cooldown(),
            deadline: self.first_byte_timeout(),
            switches: self.switches().clone(),
            dropped: self.dropped().clone(),
            ctx: ctx.clone(),
        };
        let task = tokio::spawn(async move {
            run.go(in_rx, &ev_tx).await;
            let _ = ev_tx.send(SttEvent::Closed).await;
        });
        SttStream {
            input: in_tx,
            events: ev_rx,
            guard: TaskGuard::new(task),
        }
    }

    /// The first member to be tried now.
    fn endpointing_ms(&self) -> u64 {
        self.first_now().map_or(0, |m| m.provider.endpointing_ms())
    }

    /// Whether the member tried first now ends turns itself; a switch tells the call what
    /// the new member does ([`SttEvent::Switched`]).
    fn ends_turns(&self) -> bool {
        self.first_now().is_some_and(|m| m.provider.ends_turns())
    }
}

impl Chain<dyn SttProvider> {
    fn first_now(&self) -> Option<&Member<dyn SttProvider>> {
        self.order(Instant::now())
            .first()
            .and_then(|&i| self.members().get(i))
    }
}

/// One session through the chain.
struct Run {
    members: Vec<Member<dyn SttProvider>>,
    cooldown: Duration,
    deadline: Duration,
    switches: Arc<std::sync::atomic::AtomicU64>,
    dropped: Arc<Mutex<Option<(String, String)>>>,
    ctx: SttContext,
}

/// How opening one member went.
enum Open {
    Connected,
    Failed(SttSwitchReason, String),
    /// The call closed the session before any member opened.
    InputClosed,
}

impl Run {
    async fn go(self, mut input: mpsc::Receiver<SttInput>, ev: &mpsc::Sender<SttEvent>) {
        let mut previous = self.dropped.lock().ok().and_then(|mut d| d.take());
        let n = self.members.len();
        let mut buffered: VecDeque<SttInput> = VecDeque::new();
        for (k, m) in self.members.iter().enumerate() {
            let next = self.members.get(k + 1);
            let ctx = SttContext {
                fallback: next.is_some(),
                ..self.ctx.clone()
            };
            let mut stream = m.provider.open(&ctx);
            match self
                .connect(&mut stream, &mut input, &mut buffered, next.is_some(), ev)
                .await
            {
                Open::Connected => {}
                Open::InputClosed => return,
                Open::Failed(reason, message) => {
                    if n > 1 {
                        m.health.mark_down(Instant::now(), self.cooldown);
                    }
                    let Some(next) = next else {
                        let _ = ev
                            .send(SttEvent::Error {
                                message,
                                fatal: true,
                            })
                            .await;
                        return;
                    };
                    tracing::warn!(call = %self.ctx.call_id, from = %m.name, to = %next.name, %reason, %message, "speech-to-text switched to the next of the chain");
                    if !self.switch(ev, &m.name, next, reason, message).await {
                        return;
                    }
                    // Dropping `stream` cancels the failed attempt.
                    continue;
                }
            }
            m.health.mark_up();
            if let Some((from, why)) = previous.take()
                && from != m.name
                && !self
                    .switch(ev, &from, m, SttSwitchReason::Dropped, why)
                    .await
            {
                return;
            }
            if ev.send(SttEvent::Connected).await.is_err() {
                return;
            }
            self.serve(m, stream, input, buffered, ev).await;
            return;
        }
    }

    /// Reports a switch from `from` to `to`; false when the call is gone.
    async fn switch(
        &self,
        ev: &mpsc::Sender<SttEvent>,
        from: &str,
        to: &Member<dyn SttProvider>,
        reason: SttSwitchReason,
        message: String,
    ) -> bool {
        self.switches.fetch_add(1, Ordering::Relaxed);
        ev.send(SttEvent::Switched {
            from: from.to_string(),
            to: to.name.clone(),
            reason,
            message,
            ends_turns: to.provider.ends_turns(),
        })
        .await
        .is_ok()
    }

    /// Waits for the member's session to open (within the deadline when a next member
    /// exists), keeping the call's input meanwhile.
    async fn connect(
        &self,
        stream: &mut SttStream,
        input: &mut mpsc::Receiver<SttInput>,
        buffered: &mut VecDeque<SttInput>,
        has_next: bool,
        ev: &mpsc::Sender<SttEvent>,
    ) -> Open {
        let deadline = Instant::now() + self.deadline;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline), if has_next => {
                    return Open::Failed(
                        SttSwitchReason::OpenTimeout,
                        format!("the session did not open within {} ms", self.deadline.as_millis()),
                    );
                }
                msg = input.recv() => match msg {
                    Some(SttInput::Close) | None => return Open::InputClosed,
                    Some(i) => {
                        if buffered.len() >= BUFFER_FRAMES {
                            buffered.pop_front();
                        }
                        buffered.push_back(i);
                    }
                },
                e = stream.events.recv() => match e {
                    Some(SttEvent::Connected) => return Open::Connected,
                    Some(SttEvent::Error { message, fatal: true }) => {
                        return Open::Failed(SttSwitchReason::OpenFailed, message);
                    }
                    Some(SttEvent::Closed) | None => {
                        return Open::Failed(
                            SttSwitchReason::OpenFailed,
                            "the session ended before it opened".into(),
                        );
                    }
                    Some(other) => {
                        if ev.send(other).await.is_err() {
                            return Open::InputClosed;
                        }
                    }
                },
            }
        }
    }

    /// Relays between the call and the member that opened until the session ends.
    async fn serve(
        &self,
        m: &Member<dyn SttProvider>,
        mut stream: SttStream,
        mut input: mpsc::Receiver<SttInput>,
        buffered: VecDeque<SttInput>,
        ev: &mpsc::Sender<SttEvent>,
    ) {
        for i in buffered {
            if stream.input.send(i).await.is_err() {
                break;
            }
        }
        let mut closing = false;
        let mut failed = false;
        loop {
            tokio::select! {
                msg = input.recv(), if !closing => {
                    let msg = msg.unwrap_or(SttInput::Close);
                    closing = matches!(msg, SttInput::Close);
                    // A full queue drops the frame, as the call's own try_send would.
                    let _ = stream.input.try_send(msg);
                }
                e = stream.events.recv() => {
                    let e = match e {
                        Some(SttEvent::Closed) | None => {
                            if !closing && !failed {
                                self.dropped(m, "the session closed".into());
                            }
                            return;
                        }
                        Some(e) => e,
                    };
                    if let SttEvent::Error { message, fatal: true } = &e
                        && !closing
                    {
                        failed = true;
                        self.dropped(m, message.clone());
                    }
                    if ev.send(e).await.is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// `m`'s session dropped mid-call: cool it down and remember it for the reopen.
    fn dropped(&self, m: &Member<dyn SttProvider>, why: String) {
        if self.members.len() > 1 {
            m.health.mark_down(Instant::now(), self.cooldown);
        }
        if let Ok(mut d) = self.dropped.lock() {
            *d = Some((m.name.clone(), why));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::fallback::Health;
    use bytes::Bytes;
    use std::sync::atomic::AtomicU64;

    /// How a scripted member's session goes.
    #[derive(Clone)]
    enum Script {
        /// Opens and records the input it gets.
        Opens,
        /// Fails before opening.
        Refuses,
        /// Never answers.
        Hangs,
        /// Opens, then drops at once.
        OpensThenDrops,
    }

    struct Scripted {
        script: Script,
        opens: AtomicU64,
        heard: Arc<Mutex<Vec<SttInput>>>,
        ends_turns: bool,
    }

    impl SttProvider for Scripted {
        fn open(&self, _ctx: &SttContext) -> SttStream {
            self.opens.fetch_add(1, Ordering::Relaxed);
            let (in_tx, mut in_rx) = mpsc::channel(16);
            let (tx, rx) = mpsc::channel(16);
            let script = self.script.clone();
            let heard = self.heard.clone();
            let task = tokio::spawn(async move {
                match script {
                    Script::Refuses => {
                        let _ = tx
                            .send(SttEvent::Error {
                                message: "HTTP 503".into(),
                                fatal: true,
                            })
                            .await;
                        let _ = tx.send(SttEvent::Closed).await;
                    }
                    Script::Hangs => std::future::pending::<()>().await,
                    Script::Opens => {
                        let _ = tx.send(SttEvent::Connected).await;
                        while let Some(i) = in_rx.recv().await {
                            if let SttInput::Audio(b) = &i {
                                let _ = tx
                                    .send(SttEvent::Interim(format!("{} bytes", b.len())))
                                    .await;
                            }
                            heard.lock().expect("lock").push(i);
                        }
                    }
                    Script::OpensThenDrops => {
                        let _ = tx.send(SttEvent::Connected).await;
                        let _ = tx
                            .send(SttEvent::Error {
                                message: "closed 1011".into(),
                                fatal: true,
                            })
                            .await;
                        let _ = tx.send(SttEvent::Closed).await;
                    }
                }
            });
            SttStream {
                input: in_tx,
                events: rx,
                guard: TaskGuard::new(task),
            }
        }

        fn ends_turns(&self) -> bool {
            self.ends_turns
        }
    }

    fn member(
        name: &str,
        script: Script,
        health: Arc<Health>,
    ) -> (Member<dyn SttProvider>, Arc<Scripted>) {
        let s = Arc::new(Scripted {
            script,
            opens: AtomicU64::new(0),
            heard: Arc::default(),
            ends_turns: name == "b",
        });
        let p: Arc<dyn SttProvider> = s.clone();
        (
            Member {
                name: name.into(),
                provider: p,
                health,
            },
            s,
        )
    }

    fn chain(members: Vec<Member<dyn SttProvider>>) -> Chain<dyn SttProvider> {
        chain_cooling(members, Duration::from_secs(30))
    }

    fn chain_cooling(
        members: Vec<Member<dyn SttProvider>>,
        cooldown: Duration,
    ) -> Chain<dyn SttProvider> {
        Chain::new(
            members,
            cooldown,
            Duration::from_millis(200),
            Arc::new(AtomicU64::new(0)),
        )
    }

    async fn until_connected(s: &mut SttStream) -> Vec<SttEvent> {
        let mut v = Vec::new();
        while let Some(e) = s.events.recv().await {
            let done = e == SttEvent::Connected;
            v.push(e);
            if done {
                break;
            }
        }
        v
    }

    #[tokio::test]
    async fn a_refusing_primary_hands_the_session_and_the_early_audio_to_the_backup() {
        let (a, a_s) = member("a", Script::Refuses, Arc::default());
        let (b, b_s) = member("b", Script::Opens, Arc::default());
        let health_a = a.health.clone();
        let c = chain(vec![a, b]);
        assert!(!c.ends_turns(), "a is first");
        let mut s = c.open(&SttContext::default());
        s.input
            .try_send(SttInput::Audio(Bytes::from_static(&[1; 160])))
            .expect("queued");
        let evs = until_connected(&mut s).await;
        assert_eq!(
            evs[0],
            SttEvent::Switched {
                from: "a".into(),
                to: "b".into(),
                reason: SttSwitchReason::OpenFailed,
                message: "HTTP 503".into(),
                ends_turns: true,
            }
        );
        assert_eq!(evs.last(), Some(&SttEvent::Connected));
        // The audio sent while the chain was opening reaches the backup.
        assert_eq!(
            s.events.recv().await,
            Some(SttEvent::Interim("160 bytes".into()))
        );
        assert_eq!(c.switches().load(Ordering::Relaxed), 1);
        assert!(health_a.is_down(Instant::now()));
        assert!(c.ends_turns(), "b is first while a cools down");
        drop(s);

        // The next call skips the cooling primary…
        let mut s = c.open(&SttContext::default());
        assert_eq!(until_connected(&mut s).await, [SttEvent::Connected]);
        assert_eq!(a_s.opens.load(Ordering::Relaxed), 1);
        assert_eq!(b_s.opens.load(Ordering::Relaxed), 2);
        drop(s);
        // …and after the cool-down (on the health's injected clock) the primary is first again.
        let now = Instant::now();
        assert_eq!(c.order(now), [1, 0]);
        assert_eq!(c.order(now + Duration::from_secs(31)), [0, 1]);
    }

    #[tokio::test]
    async fn after_the_cool_down_the_primary_is_opened_again() {
        let cool = Duration::from_millis(100);
        let (a, a_s) = member("a", Script::Refuses, Arc::default());
        let (b, b_s) = member("b", Script::Opens, Arc::default());
        let c = chain_cooling(vec![a, b], cool);
        let mut s = c.open(&SttContext::default());
        until_connected(&mut s).await;
        let mut s = c.open(&SttContext::default());
        assert_eq!(until_connected(&mut s).await, [SttEvent::Connected]);
        assert_eq!(
            a_s.opens.load(Ordering::Relaxed),
            1,
            "skipped while cooling"
        );
        // The cool-down is the clock's business: wait it out, then the primary is retried.
        tokio::time::sleep(cool).await;
        let mut s = c.open(&SttContext::default());
        let evs = until_connected(&mut s).await;
        assert!(
            matches!(&evs[0], SttEvent::Switched { from, .. } if from == "a"),
            "{evs:?}"
        );
        assert_eq!(a_s.opens.load(Ordering::Relaxed), 2);
        assert_eq!(b_s.opens.load(Ordering::Relaxed), 3);
    }

    #[tokio::test]
    async fn a_primary_that_never_opens_is_left_at_the_deadline() {
        let (a, _) = member("a", Script::Hangs, Arc::default());
        let (b, _) = member("b", Script::Opens, Arc::default());
        let c = chain(vec![a, b]);
        let mut s = c.open(&SttContext::default());
        let evs = until_connected(&mut s).await;
        assert!(
            matches!(&evs[0], SttEvent::Switched { reason: SttSwitchReason::OpenTimeout, message, .. } if message.contains("200 ms")),
            "{evs:?}"
        );
    }

    #[tokio::test]
    async fn the_last_member_failing_is_a_fatal_error() {
        let (a, _) = member("a", Script::Refuses, Arc::default());
        let (b, _) = member("b", Script::Refuses, Arc::default());
        let c = chain(vec![a, b]);
        let mut s = c.open(&SttContext::default());
        let mut evs = Vec::new();
        while let Some(e) = s.events.recv().await {
            evs.push(e);
        }
        assert!(matches!(&evs[0], SttEvent::Switched { .. }));
        assert_eq!(
            evs[1..],
            [
                SttEvent::Error {
                    message: "HTTP 503".into(),
                    fatal: true
                },
                SttEvent::Closed
            ]
        );
    }

    #[tokio::test]
    async fn a_session_dropped_mid_call_reopens_on_the_next_member() {
        let (a, _) = member("a", Script::OpensThenDrops, Arc::default());
        let (b, _) = member("b", Script::Opens, Arc::default());
        let c = chain(vec![a, b]);
        let mut s = c.open(&SttContext::default());
        assert_eq!(until_connected(&mut s).await, [SttEvent::Connected]);
        assert!(matches!(
            s.events.recv().await,
            Some(SttEvent::Error { fatal: true, .. })
        ));
        assert_eq!(s.events.recv().await, Some(SttEvent::Closed));
        // The call reopens through the chain.
        let mut s = c.open(&SttContext::default());
        let evs = until_connected(&mut s).await;
        assert_eq!(
            evs[0],
            SttEvent::Switched {
                from: "a".into(),
                to: "b".into(),
                reason: SttSwitchReason::Dropped,
                message: "closed 1011".into(),
                ends_turns: true,
            }
        );
    }

    #[test]
    fn health_cools_down_on_an_injected_clock() {
        let h = Health::default();
        let t0 = Instant::now();
        h.mark_down(t0, Duration::from_millis(50));
        assert!(h.is_down(t0 + Duration::from_millis(49)));
        assert!(!h.is_down(t0 + Duration::from_millis(50)));
        h.mark_down(t0, Duration::from_secs(5));
        h.mark_up();
        assert!(!h.is_down(t0));
    }
}
