//! Fallback chains of brains (`[agents.NAME] llm = ["hermes", "backup"]`; TTS chains are in
//! [`super::fallback`]): one
//! [`LlmProvider`] made of several, tried in order for each turn. A provider that fails before
//! its first reply token — it cannot be reached, answers 5xx or 429 (or any other error), or
//! misses its own `first_token_timeout_s` — is skipped for `cooldown` and the next one gets
//! the same turn at once; each switch reaches the call as [`LlmEvent::Switched`] (a typed
//! timeline event) and counts in [`FallbackLlm::switches`] (exported in `/metrics`). Once a
//! provider has produced a token the turn stays with it: a reply never switches
//! mid-sentence. After the cool-down the failed provider is tried first again; when every
//! provider is cooling down they are all tried in order anyway.
//!
//! Outages (`brain_retry_s`): the chain itself never waits. One attempt of a turn tries each
//! member once, in the order above, switching at once; only when every member failed does the
//! call see the failure — as [`LlmEvent::Unavailable`] if any member's failure may pass (no
//! connection, a broken stream, 429/502/503; the shortest `Retry-After` of them), else as
//! [`LlmEvent::Error`] — and the call's retry (`call::policy`) then runs the whole chain again
//! after its backoff. So a backup answers at once when the primary restarts, and a turn waits
//! only when no member can answer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{ChatTurn, LlmEvent, LlmProvider, LlmStream};
use crate::util::TaskGuard;

pub(crate) struct FallbackLlm {
    chain: Vec<(String, Arc<dyn LlmProvider>)>,
    cooldown: Duration,
    /// Per provider: skipped until then.
    down_until: Arc<Mutex<Vec<Option<Instant>>>>,
    switches: Arc<AtomicU64>,
}

impl FallbackLlm {
    /// `switches` is shared by every chain (the `/metrics` counter).
    pub(crate) fn new(
        chain: Vec<(String, Arc<dyn LlmProvider>)>,
        cooldown: Duration,
        switches: Arc<AtomicU64>,
    ) -> Self {
        let n = chain.len();
        Self {
            chain,
            cooldown,
            down_until: Arc::new(Mutex::new(vec![None; n])),
            switches,
        }
    }

    /// The order to try now: healthy providers in chain order, then cooling ones.
    fn order(&self, now: Instant) -> Vec<usize> {
        let down = self
            .down_until
            .lock()
            .map(|d| d.clone())
            .unwrap_or_default();
        let cooling = |i: usize| down.get(i).copied().flatten().is_some_and(|t| t > now);
        let (mut up, cool): (Vec<usize>, Vec<usize>) =
            (0..self.chain.len()).partition(|&i| !cooling(i));
        up.extend(cool);
        up
    }
}

impl LlmProvider for FallbackLlm {
    fn keeps_history(&self) -> bool {
        // Every turn carries the whole history, so a stateless backup still has it; the
        // primary's habit decides how interruptions are told.
        self.chain.first().is_some_and(|(_, p)| p.keeps_history())
    }

    fn stream(&self, turn: ChatTurn) -> LlmStream {
        let (tx, rx) = mpsc::channel(64);
        let order = self.order(Instant::now());
        let chain = self.chain.clone();
        let down = self.down_until.clone();
        let switches = self.switches.clone();
        let cooldown = self.cooldown;
        let task = tokio::spawn(async move {
            // Whether a member failed in a way that may pass, and the shortest wait one asked for.
            let mut unavailable = false;
            let mut retry_after: Option<Duration> = None;
            for (pos, &i) in order.iter().enumerate() {
                let (name, provider) = &chain[i];
                let mut inner = provider.stream(turn.clone());
                let first = inner
                    .events
                    .recv()
                    .await
                    .unwrap_or_else(|| LlmEvent::Error("the reply stream ended early".into()));
                let reason = match first {
                    LlmEvent::Error(reason) => reason,
                    LlmEvent::Unavailable {
                        message,
                        retry_after: after,
                    } => {
                        unavailable = true;
                        retry_after = match (retry_after, after) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        };
                        message
                    }
                    first => {
                        if let Ok(mut d) = down.lock() {
                            d[i] = None;
                        }
                        if tx.send(first).await.is_err() {
                            return;
                        }
                        while let Some(ev) = inner.events.recv().await {
                            if tx.send(ev).await.is_err() {
                                return;
                            }
                        }
                        return;
                    }
                };
                tracing::warn!(brain = %name, error = %reason, "brain failed before its first token");
                if let Ok(mut d) = down.lock() {
                    d[i] = Some(Instant::now() + cooldown);
                }
                let Some(&next) = order.get(pos + 1) else {
                    // Every member failed: the call may retry the whole chain if one of them
                    // may be back soon.
                    let last = if unavailable {
                        LlmEvent::Unavailable {
                            message: reason,
                            retry_after,
                        }
                    } else {
                        LlmEvent::Error(reason)
                    };
                    let _ = tx.send(last).await;
                    return;
                };
                switches.fetch_add(1, Ordering::Relaxed);
                let switched = LlmEvent::Switched {
                    from: name.clone(),
                    to: chain[next].0.clone(),
                    reason,
                };
                if tx.send(switched).await.is_err() {
                    return;
                }
            }
        });
        LlmStream {
            events: rx,
            guard: TaskGuard::new(task),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A brain that answers from a script, one entry per turn (`None`: fails).
    struct Scripted {
        name: &'static str,
        replies: Mutex<Vec<Option<&'static str>>>,
        calls: Arc<AtomicU64>,
    }

    impl LlmProvider for Scripted {
        fn stream(&self, _turn: ChatTurn) -> LlmStream {
            self.calls.fetch_add(1, Ordering::Relaxed);
            let reply = self
                .replies
                .lock()
                .map(|mut r| if r.is_empty() { None } else { r.remove(0) })
                .ok()
                .flatten();
            let (tx, rx) = mpsc::channel(8);
            let name = self.name;
            let task = tokio::spawn(async move {
                match reply {
                    Some(t) => {
                        let _ = tx.send(LlmEvent::Delta(t.into())).await;
                        let _ = tx.send(LlmEvent::Done).await;
                    }
                    None => {
                        let _ = tx
                            .send(LlmEvent::Error(format!("HTTP 500: {name} is down")))
                            .await;
                    }
                }
            });
            LlmStream {
                events: rx,
                guard: TaskGuard::new(task),
            }
        }
    }

    fn brain(
        name: &'static str,
        replies: Vec<Option<&'static str>>,
    ) -> (Arc<dyn LlmProvider>, Arc<AtomicU64>) {
        let calls = Arc::new(AtomicU64::new(0));
        let p = Scripted {
            name,
            replies: Mutex::new(replies),
            calls: calls.clone(),
        };
        (Arc::new(p), calls)
    }

    fn turn() -> ChatTurn {
        ChatTurn {
            call_id: "c".into(),
            caller: None,
            system_prompt: String::new(),
            history: Vec::new(),
            history_limits: Default::default(),
            tools: None,
            call_token: None,
            trace: None,
        }
    }

    async fn events(llm: &FallbackLlm) -> Vec<LlmEvent> {
        let mut s = llm.stream(turn());
        let mut out = Vec::new();
        while let Some(e) = s.events.recv().await {
            out.push(e);
        }
        out
    }

    #[tokio::test]
    async fn a_failed_primary_is_skipped_for_the_cooldown_then_retried() {
        let (primary, p_calls) = brain("hermes", vec![None, Some("not asked")]);
        let (backup, b_calls) = brain("backup", vec![Some("one"), Some("two")]);
        let switches = Arc::new(AtomicU64::new(0));
        let llm = FallbackLlm::new(
            vec![("hermes".into(), primary), ("backup".into(), backup)],
            Duration::from_secs(30),
            switches.clone(),
        );
        // Turn 1: the primary fails, the backup answers the same turn.
        let ev = events(&llm).await;
        assert!(
            matches!(&ev[0], LlmEvent::Switched { from, to, reason } if from == "hermes" && to == "backup" && reason.contains("HTTP 500")),
            "{ev:?}"
        );
        assert_eq!(ev[1], LlmEvent::Delta("one".into()));
        assert_eq!(switches.load(Ordering::Relaxed), 1);
        // Turn 2, inside the cool-down: the primary is not asked.
        let ev = events(&llm).await;
        assert_eq!(ev[0], LlmEvent::Delta("two".into()));
        assert_eq!(p_calls.load(Ordering::Relaxed), 1);
        assert_eq!(b_calls.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn after_the_cooldown_the_primary_is_tried_first_again() {
        let (primary, p_calls) = brain("hermes", vec![None, Some("primary back")]);
        let (backup, b_calls) = brain("backup", vec![Some("one"), Some("two")]);
        // A zero cool-down has always passed by the next turn.
        let llm = FallbackLlm::new(
            vec![("hermes".into(), primary), ("backup".into(), backup)],
            Duration::ZERO,
            Arc::new(AtomicU64::new(0)),
        );
        let ev = events(&llm).await;
        assert_eq!(ev[1], LlmEvent::Delta("one".into()));
        let ev = events(&llm).await;
        assert_eq!(ev[0], LlmEvent::Delta("primary back".into()));
        assert_eq!(p_calls.load(Ordering::Relaxed), 2);
        assert_eq!(b_calls.load(Ordering::Relaxed), 1);
    }

    /// A brain that is down (connection refused), `Retry-After` `after`.
    struct Down(Option<Duration>, Arc<AtomicU64>);

    impl LlmProvider for Down {
        fn stream(&self, _turn: ChatTurn) -> LlmStream {
            self.1.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = mpsc::channel(8);
            let ev = LlmEvent::Unavailable {
                message: "request failed: connection refused".into(),
                retry_after: self.0,
            };
            let task = tokio::spawn(async move {
                let _ = tx.send(ev).await;
            });
            LlmStream {
                events: rx,
                guard: TaskGuard::new(task),
            }
        }
    }

    #[tokio::test]
    async fn a_primary_that_is_down_switches_at_once_and_a_chain_that_is_down_may_be_retried() {
        let p_calls = Arc::new(AtomicU64::new(0));
        let primary: Arc<dyn LlmProvider> =
            Arc::new(Down(Some(Duration::from_secs(5)), p_calls.clone()));
        let (backup, b_calls) = brain("backup", vec![Some("backup here"), None]);
        let llm = FallbackLlm::new(
            vec![
                ("hermes".into(), primary.clone()),
                ("backup".into(), backup),
            ],
            Duration::ZERO,
            Arc::new(AtomicU64::new(0)),
        );
        // The backup answers the turn the primary could not.
        let ev = events(&llm).await;
        assert!(matches!(&ev[0], LlmEvent::Switched { .. }), "{ev:?}");
        assert_eq!(ev[1], LlmEvent::Delta("backup here".into()));
        // Both fail (the backup with a plain error): the call may still retry, after the
        // primary's hint.
        let ev = events(&llm).await;
        assert!(
            matches!(ev.last(), Some(LlmEvent::Unavailable { retry_after, .. }) if *retry_after == Some(Duration::from_secs(5))),
            "{ev:?}"
        );
        assert_eq!(p_calls.load(Ordering::Relaxed), 2);
        assert_eq!(b_calls.load(Ordering::Relaxed), 2);
        // Two members down: the shortest hint wins.
        let other: Arc<dyn LlmProvider> = Arc::new(Down(
            Some(Duration::from_secs(1)),
            Arc::new(AtomicU64::new(0)),
        ));
        let llm = FallbackLlm::new(
            vec![("a".into(), primary), ("b".into(), other)],
            Duration::ZERO,
            Arc::new(AtomicU64::new(0)),
        );
        let ev = events(&llm).await;
        assert!(
            matches!(ev.last(), Some(LlmEvent::Unavailable { retry_after, .. }) if *retry_after == Some(Duration::from_secs(1))),
            "{ev:?}"
        );
    }

    #[tokio::test]
    async fn when_every_brain_fails_the_last_error_reaches_the_call() {
        let (a, _) = brain("a", vec![]);
        let (b, _) = brain("b", vec![]);
        let llm = FallbackLlm::new(
            vec![("a".into(), a), ("b".into(), b)],
            Duration::from_secs(30),
            Arc::new(AtomicU64::new(0)),
        );
        let ev = events(&llm).await;
        assert_eq!(ev.len(), 2, "{ev:?}");
        assert!(matches!(&ev[1], LlmEvent::Error(m) if m.contains("b is down")));
    }
}
