//! An in-memory call: the real call actor with its carrier leg, speech-to-text, brain and
//! text-to-speech as channels in this process, on tokio's clock. Under
//! `#[tokio::test(start_paused = true)]` a whole conversation — greeting, caller turns,
//! barge-in, fillers, idle nudges, hang-up — runs in virtual time: deterministic, fast, and
//! independent of machine load. The socket tests keep the wire protocols honest; this keeps
//! the timing honest.
//!
//! The [`MemoryLeg`] plays the carrier: it sends the caller's audio as a carrier does (one
//! 20 ms frame every 20 ms, silence when the caller says nothing), plays the agent's audio in
//! real time from a queue, echoes each mark when the audio before it has played, flushes the
//! queue on `clear` (echoing the marks it drops, as Twilio does), and records what the caller
//! heard and when ([`LegState`]) and the audio itself. The providers are `provider::memory`'s.
//! The leg runs on whichever clock tokio has: `patterd try` (`app::trial`) puts it on a call
//! with the configured providers on the real clock.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Notify, mpsc};
use tokio::time::{Instant, MissedTickBehavior};

use super::{CallError, CallHandle, MediaAttach};
#[cfg(test)]
use super::{CallRecord, CallRegistry, CallSetup, actor, registry::InsertError};
use crate::carrier::dial::{Outbound, PlaceCall, PlaceError};
use crate::carrier::registry::{BoxFuture, Route};
use crate::carrier::{
    Carrier, CarrierError, CarrierKind, DtmfDelivery, FRAME_BYTES, FRAME_MS, Leg, MediaCommand,
    MediaEvent, StreamStart, TransferRequest,
};
#[cfg(test)]
use crate::config::AgentConfig;
#[cfg(test)]
use crate::provider::AgentProviders;
use crate::util::TaskGuard;

/// μ-law silence.
const SILENCE: u8 = 0xFF;
/// Capacity of the leg's channels (the media pump's are of the same order).
const QUEUE: usize = 512;

/// What the caller heard and did, in ms from the moment media attached.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LegState {
    /// Each stretch of agent audio the caller heard without a break: (start, end) in ms.
    pub agent_audio: Vec<(u64, u64)>,
    /// Agent audio played, in bytes (8 per ms).
    pub agent_bytes: usize,
    /// Marks echoed to the call: (when, name).
    pub marks: Vec<(u64, String)>,
    /// When each `clear` arrived.
    pub clears: Vec<u64>,
    /// When each of the caller's clips began to play into the call.
    pub(crate) caller_clips: Vec<u64>,
    /// When the caller's queued audio had all been sent (the line went quiet).
    pub(crate) caller_done: Option<u64>,
    /// When the call hung up the leg (the last time, if it asked more than once).
    pub hung_up: Option<u64>,
    /// Hang-up requests the carrier received.
    pub hang_ups: usize,
    /// True while agent audio is playing (the stretch is added to `agent_audio` when it ends).
    pub agent_playing: bool,
    /// When the line closed: the caller hung up or the call dropped its media.
    pub closed: Option<u64>,
    /// Transfers asked of the carrier: (when, destination).
    pub transfers: Vec<(u64, String)>,
    /// DTMF the call sent through the carrier's command.
    pub dtmf_sent: Vec<String>,
}

impl LegState {
    #[cfg(test)]
    /// True while agent audio reached the caller at `t_ms`.
    pub(crate) fn agent_audible_at(&self, t_ms: u64) -> bool {
        self.agent_audio
            .iter()
            .any(|(s, e)| (*s..*e).contains(&t_ms))
    }

    #[cfg(test)]
    /// The first moment at or after `t_ms` when no agent audio was playing.
    pub(crate) fn agent_quiet_after(&self, t_ms: u64) -> Option<u64> {
        if !self.agent_audible_at(t_ms) {
            return Some(t_ms);
        }
        self.agent_audio
            .iter()
            .find(|(s, e)| (*s..*e).contains(&t_ms))
            .map(|(_, e)| *e)
    }

    /// When the last stretch of agent audio ended; `None` while audio plays or before any has.
    pub(crate) fn agent_quiet_since(&self) -> Option<u64> {
        if self.agent_playing {
            return None;
        }
        self.agent_audio.last().map(|(_, e)| *e)
    }
}

#[derive(Default)]
struct Shared {
    state: Mutex<LegState>,
    /// The agent audio the caller heard, in order (μ-law 8 kHz).
    heard: Mutex<Vec<u8>>,
    changed: Notify,
}

impl Shared {
    /// Changes the state and wakes its waiters.
    fn with<R>(&self, f: impl FnOnce(&mut LegState) -> R) -> R {
        let r = f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()));
        self.changed.notify_waiters();
        r
    }

    fn read(&self) -> LegState {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn heard(&self, audio: &[u8]) {
        self.heard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(audio);
    }
}

/// What the carrier's REST side does with the call's hang-up, transfer and DTMF requests.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rest {
    #[cfg_attr(not(test), allow(dead_code))]
    /// Records them in [`LegState`] and accepts them.
    Recorded,
    /// There is no carrier: hang-up does nothing, transfer and DTMF fail with this message.
    Unreachable(&'static str),
}

/// What the caller does next on the line.
enum CallerCmd {
    Audio(Vec<u8>),
    HangUp,
}

/// The carrier's REST side of an in-memory call: records hang-up, transfers and DTMF.
struct MemoryCarrier {
    shared: Arc<Shared>,
    started: Instant,
}

impl MemoryCarrier {
    fn ms(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.started)
            .as_millis() as u64
    }
}

impl Carrier for MemoryCarrier {
    fn kind(&self) -> CarrierKind {
        CarrierKind::Web
    }
    fn is_configured(&self) -> bool {
        true
    }
    fn has_account(&self, _account: &str) -> bool {
        true
    }
    fn required_keys(&self) -> Vec<&'static str> {
        Vec::new()
    }
    fn routes(self: Arc<Self>) -> Vec<Route> {
        Vec::new()
    }
    fn hang_up(&self, _account: &str, _leg_id: &str) -> BoxFuture<Result<(), CarrierError>> {
        let at = self.ms();
        self.shared.with(|s| {
            s.hung_up = Some(at);
            s.hang_ups += 1;
        });
        Box::pin(std::future::ready(Ok(())))
    }
    fn place_call(&self, account: &str, _call: PlaceCall) -> BoxFuture<Result<String, PlaceError>> {
        let account = account.to_string();
        Box::pin(std::future::ready(Err(PlaceError::Unconfigured {
            account,
            what: "nothing: an in-memory leg places no calls",
        })))
    }
    fn cancel(
        &self,
        _account: &str,
        _call_id: &str,
        _outbound: &Outbound,
    ) -> BoxFuture<Result<(), CarrierError>> {
        Box::pin(std::future::ready(Ok(())))
    }
    fn transfer(
        &self,
        _account: &str,
        _leg_id: &str,
        request: &TransferRequest,
    ) -> BoxFuture<Result<(), CarrierError>> {
        let at = self.ms();
        let to = request.to.clone();
        self.shared.with(|s| s.transfers.push((at, to)));
        Box::pin(std::future::ready(Ok(())))
    }
    fn send_dtmf(
        &self,
        _account: &str,
        _leg_id: &str,
        digits: &str,
    ) -> BoxFuture<Result<DtmfDelivery, CarrierError>> {
        let digits = digits.to_string();
        self.shared.with(|s| s.dtmf_sent.push(digits));
        Box::pin(std::future::ready(Ok(DtmfDelivery::Sent)))
    }
}

/// The carrier's side of an in-memory call.
pub(crate) struct MemoryLeg {
    shared: Arc<Shared>,
    started: Instant,
    caller: mpsc::Sender<CallerCmd>,
    _task: TaskGuard,
}

impl MemoryLeg {
    /// Attaches a new leg to the call `handle` (whose carrier id is `call_id`), its REST side
    /// as `rest` says.
    pub(crate) fn attach(
        handle: &CallHandle,
        call_id: &str,
        rest: Rest,
    ) -> Result<Self, CallError> {
        let (events_tx, events) = mpsc::channel(QUEUE);
        let (commands, commands_rx) = mpsc::channel(QUEUE);
        let (caller, caller_rx) = mpsc::channel(64);
        let shared = Arc::new(Shared::default());
        let started = Instant::now();
        let line = Line {
            shared: shared.clone(),
            started,
            to_call: events_tx,
            playback: VecDeque::new(),
            caller_audio: VecDeque::new(),
            playing_since: None,
        };
        let leg = match rest {
            Rest::Recorded => Leg::new(
                Arc::new(MemoryCarrier {
                    shared: shared.clone(),
                    started,
                }),
                "memory",
                call_id,
                "",
            ),
            Rest::Unreachable(why) => Leg::unreachable(why),
        };
        handle.attach(MediaAttach {
            start: StreamStart {
                call_id: call_id.to_string(),
                stream_id: "MZmemory".into(),
                custom_parameters: Default::default(),
            },
            events,
            commands,
            leg,
            ingress: None,
        })?;
        let task = tokio::spawn(line.run(commands_rx, caller_rx));
        Ok(Self {
            shared,
            started,
            caller,
            _task: TaskGuard::new(task),
        })
    }

    /// The caller says `ulaw` (μ-law 8 kHz), after what was queued before.
    pub(crate) fn say(&self, ulaw: &[u8]) {
        let _ = self.caller.try_send(CallerCmd::Audio(ulaw.to_vec()));
    }

    #[cfg(test)]
    /// The caller is silent for `ms` (after what was queued before).
    pub(crate) fn silence(&self, ms: u64) {
        self.say(&vec![SILENCE; ms as usize * 8]);
    }

    /// The caller hangs up (after what was queued before).
    pub(crate) fn hang_up(&self) {
        let _ = self.caller.try_send(CallerCmd::HangUp);
    }

    /// What the caller heard and did so far.
    pub(crate) fn state(&self) -> LegState {
        self.shared.read()
    }

    /// The agent audio the caller heard so far, μ-law 8 kHz.
    pub(crate) fn heard_audio(&self) -> Vec<u8> {
        self.shared
            .heard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits until `pred` holds of the leg's state.
    pub(crate) async fn until(&self, pred: impl Fn(&LegState) -> bool) -> LegState {
        loop {
            let changed = self.shared.changed.notified();
            let s = self.state();
            if pred(&s) {
                return s;
            }
            changed.await;
        }
    }

    /// Waits for the next change of the leg's state, at most `limit`.
    pub(crate) async fn next_change(&self, limit: Duration) {
        let _ = tokio::time::timeout(limit, self.shared.changed.notified()).await;
    }

    #[cfg(test)]
    /// Waits until `pred` holds of the leg's state (at most `limit` of virtual time).
    pub(crate) async fn wait_for(
        &self,
        what: &str,
        limit: Duration,
        pred: impl Fn(&LegState) -> bool,
    ) -> LegState {
        match tokio::time::timeout(limit, self.until(pred)).await {
            Ok(s) => s,
            Err(_) => panic!("timed out waiting for {what}: {:#?}", self.state()),
        }
    }

    /// Ms since media attached (the time base of [`LegState`]).
    pub(crate) fn now_ms(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.started)
            .as_millis() as u64
    }
}

/// Something the agent's audio queue holds.
enum Queued {
    Audio(Bytes),
    Mark(String),
}

/// The leg's task: the line between the caller and the call.
struct Line {
    shared: Arc<Shared>,
    started: Instant,
    to_call: mpsc::Sender<super::ingress::MediaInput>,
    playback: VecDeque<Queued>,
    caller_audio: VecDeque<u8>,
    /// When the current stretch of agent audio began to play.
    playing_since: Option<u64>,
}

impl Line {
    fn ms(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.started)
            .as_millis() as u64
    }

    async fn run(
        mut self,
        mut commands: mpsc::Receiver<MediaCommand>,
        mut caller: mpsc::Receiver<CallerCmd>,
    ) {
        let mut tick = tokio::time::interval(Duration::from_millis(FRAME_MS));
        tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
        let mut pending: VecDeque<CallerCmd> = VecDeque::new();
        loop {
            tokio::select! {
                biased;
                cmd = commands.recv() => match cmd {
                    Some(cmd) => self.command(cmd),
                    None => break,
                },
                Some(cmd) = caller.recv() => pending.push_back(cmd),
                _ = tick.tick() => {
                    if !self.caller_step(&mut pending).await {
                        break;
                    }
                    self.play_frame();
                }
            }
        }
        self.stop_playing();
        let at = self.ms();
        self.shared.with(|s| s.closed = Some(at));
    }

    /// The caller's next 20 ms: queued audio (or silence), then any hang-up that waited for
    /// it. False when the caller hung up or the call is gone.
    async fn caller_step(&mut self, pending: &mut VecDeque<CallerCmd>) -> bool {
        while self.caller_audio.is_empty() {
            match pending.pop_front() {
                Some(CallerCmd::Audio(a)) => {
                    let at = self.ms();
                    self.shared.with(|s| {
                        s.caller_clips.push(at);
                        s.caller_done = None;
                    });
                    self.caller_audio.extend(a);
                }
                Some(CallerCmd::HangUp) => {
                    let _ = self.send(MediaEvent::Stop).await;
                    return false;
                }
                None => break,
            }
        }
        let frame: Vec<u8> = if self.caller_audio.is_empty() {
            vec![SILENCE; FRAME_BYTES]
        } else {
            let n = self.caller_audio.len().min(FRAME_BYTES);
            let mut f: Vec<u8> = self.caller_audio.drain(..n).collect();
            f.resize(FRAME_BYTES, SILENCE);
            if self.caller_audio.is_empty() {
                let at = self.ms() + FRAME_MS;
                self.shared.with(|s| s.caller_done = Some(at));
            }
            f
        };
        self.send(MediaEvent::Audio(Bytes::from(frame)))
            .await
            .is_ok()
    }

    async fn send(&self, ev: MediaEvent) -> Result<(), ()> {
        self.to_call.send(ev.into()).await.map_err(|_| ())
    }

    fn command(&mut self, cmd: MediaCommand) {
        let at = self.ms();
        match cmd {
            MediaCommand::Audio(a) => self.playback.push_back(Queued::Audio(a)),
            MediaCommand::Mark(name) => {
                self.playback.push_back(Queued::Mark(name));
                self.echo_marks();
            }
            MediaCommand::Clear => {
                self.stop_playing();
                let dropped: Vec<String> = self
                    .playback
                    .drain(..)
                    .filter_map(|q| match q {
                        Queued::Mark(m) => Some(m),
                        Queued::Audio(_) => None,
                    })
                    .collect();
                self.shared.with(|s| s.clears.push(at));
                for m in dropped {
                    self.echo(m);
                }
            }
        }
    }

    /// Plays one frame of agent audio, if any is queued.
    fn play_frame(&mut self) {
        let mut left = FRAME_BYTES;
        while left > 0 {
            let Some(Queued::Audio(a)) = self.playback.front_mut() else {
                break;
            };
            let n = a.len().min(left);
            self.shared.heard(&a.split_to(n));
            left -= n;
            if a.is_empty() {
                self.playback.pop_front();
            }
        }
        let played = FRAME_BYTES - left;
        let at = self.ms();
        if played > 0 {
            if self.playing_since.is_none() {
                self.playing_since = Some(at);
            }
            self.shared.with(|s| {
                s.agent_bytes += played;
                s.agent_playing = true;
            });
        } else {
            self.stop_playing();
        }
        self.echo_marks();
    }

    /// Ends the current stretch of agent audio (the caller hears it stop now).
    fn stop_playing(&mut self) {
        if let Some(since) = self.playing_since.take() {
            let at = self.ms();
            self.shared.with(|s| {
                s.agent_audio.push((since, at.max(since)));
                s.agent_playing = false;
            });
        }
    }

    /// Echoes the marks whose audio has all played.
    fn echo_marks(&mut self) {
        while let Some(Queued::Mark(_)) = self.playback.front() {
            if let Some(Queued::Mark(m)) = self.playback.pop_front() {
                self.echo(m);
            }
        }
    }

    fn echo(&self, name: String) {
        let at = self.ms();
        self.shared.with(|s| s.marks.push((at, name.clone())));
        let _ = self.to_call.try_send(MediaEvent::MarkPlayed(name).into());
    }
}

#[cfg(test)]
/// The setup of an inbound Twilio call `call_id` on `account` to `agent` with `providers`
/// (in-memory ones, say), without a store, tools, recording or turn model: 10 s for its
/// media to attach, 30 s without media before it ends.
pub(crate) fn memory_setup(
    call_id: &str,
    account: &str,
    agent: Arc<AgentConfig>,
    providers: AgentProviders,
) -> CallSetup {
    CallSetup {
        call_id: call_id.to_string(),
        carrier: CarrierKind::Twilio,
        carrier_account: account.to_string(),
        from: "+15550001111".into(),
        to: "+15550002222".into(),
        outbound: false,
        agent_name: "agent".into(),
        agent,
        providers,
        attach_timeout: Duration::from_secs(10),
        media_timeout: Duration::from_secs(30),
        log: None,
        tools: None,
        recording: None,
        turn_model: None,
        call_token: None,
        tracing: None,
    }
}

#[cfg(test)]
/// A call in memory: its actor, its handle and the carrier's leg.
pub(crate) struct MemoryCall {
    pub handle: CallHandle,
    pub leg: MemoryLeg,
    pub(crate) registry: Arc<CallRegistry>,
    call_id: String,
}

#[cfg(test)]
impl MemoryCall {
    /// Starts a call to `agent` on `providers` and answers it at once.
    pub(crate) fn start(
        agent: Arc<AgentConfig>,
        providers: AgentProviders,
    ) -> Result<Self, InsertError> {
        Self::start_with(agent, providers, |_| {})
    }

    /// [`MemoryCall::start`], with `before` done to the call before its media attaches (what
    /// a carrier's webhook tells it, e.g. that a machine answered).
    pub(crate) fn start_with(
        agent: Arc<AgentConfig>,
        providers: AgentProviders,
        before: impl FnOnce(&CallHandle),
    ) -> Result<Self, InsertError> {
        let call_id = "CAmemory".to_string();
        let setup = memory_setup(&call_id, "memory", agent, providers);
        let registry = Arc::new(CallRegistry::new());
        let handle = actor::start(setup, registry.clone(), 1)?;
        before(&handle);
        let leg =
            MemoryLeg::attach(&handle, &call_id, Rest::Recorded).map_err(|_| InsertError::Full)?;
        Ok(Self {
            handle,
            leg,
            registry,
            call_id,
        })
    }

    /// The call's record so far (or its final one).
    pub(crate) async fn record(&self) -> CallRecord {
        match self.handle.snapshot().await {
            Ok(r) => r,
            Err(_) => self.finished().await,
        }
    }

    /// Waits until the call's record satisfies `pred` (at most `limit` of virtual time).
    pub(crate) async fn wait_record(
        &self,
        what: &str,
        limit: Duration,
        pred: impl Fn(&CallRecord) -> bool,
    ) -> CallRecord {
        let wait = async {
            let mut changes = self.handle.changes();
            loop {
                match self.handle.snapshot().await {
                    Ok(r) if pred(&r) => return r,
                    Ok(_) => {}
                    Err(_) => return self.finished().await,
                }
                if changes.changed().await.is_err() {
                    return self.finished().await;
                }
            }
        };
        let r = tokio::time::timeout(limit, wait)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
        assert!(pred(&r), "the call ended before {what}: {r:#?}");
        r
    }

    /// Waits for the call to end; its final record.
    pub(crate) async fn finished(&self) -> CallRecord {
        match self.registry.wait_finished(&self.call_id).await {
            Some(r) => r,
            None => panic!("call {} left no record", self.call_id),
        }
    }
}

#[cfg(test)]
mod tests;
