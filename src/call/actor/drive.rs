//! The call actor's side of the driving rule (see [`crate::call::policy`]): one input into
//! [`Policy::handle`], then every action from [`Policy::poll_action`] carried out in order.
//! Carrying out an action may yield an input at once (the pacer's `Started`, a refused
//! turn-model question, a carrier action asked before media attached): [`Actor::execute`] returns
//! it and the loop hands it to `handle` before polling on, so its actions come first. Also
//! here: the call's link to the shared end-of-turn model worker.

use super::*;

/// A call's side of the shared end-of-turn model worker: the caller's last 8 s (shared with
/// the caller-audio stage) and the channel its answers come back on.
pub(super) struct TurnModelLink {
    worker: TurnModelWorker,
    pub(super) ring: Arc<std::sync::Mutex<CallerRing>>,
    reply: mpsc::Sender<TurnModelAnswer>,
    pub(super) answers: mpsc::Receiver<TurnModelAnswer>,
}

impl TurnModelLink {
    pub(super) fn new(worker: TurnModelWorker) -> Self {
        let (reply, answers) = mpsc::channel(4);
        Self {
            worker,
            ring: Arc::new(std::sync::Mutex::new(CallerRing::new())),
            reply,
            answers,
        }
    }

    /// Queues a judgement of the caller's last 8 s; `Err` is the answer when it cannot be.
    fn ask(&self, pause: u64) -> Result<(), TurnModelAnswer> {
        let snapshot = self
            .ring
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .snapshot();
        self.worker.submit(pause, snapshot, &self.reply)
    }
}

impl Actor {
    /// Feeds the policy one input and carries out what it decides (the driving rule). Returns
    /// a reason to end the call when the policy hung up.
    pub(super) fn step(&mut self, input: Input) -> Option<EndReason> {
        let mut end = None;
        self.policy.handle(input, Instant::now(), &mut self.mouth);
        while let Some(action) = self.policy.poll_action() {
            if let Some(input) = self.execute(action, &mut end) {
                // The action's result, handled at once: its actions come next.
                self.policy.handle(input, Instant::now(), &mut self.mouth);
            }
        }
        end
    }

    /// Carries out one action; returns the input it yielded at once, if any. Sets `end` when
    /// the call ends.
    fn execute(&mut self, action: Action, end: &mut Option<EndReason>) -> Option<Input> {
        match action {
            Action::Clear => self.send(MediaCommand::Clear),
            Action::Speak { .. } | Action::Resume => return self.pump(),
            Action::Synthesize { id, text } => {
                self.usage.tts_characters += text.chars().count() as u64;
                let stream = self.setup.providers.tts.synthesize(&text);
                self.tts.start(id, stream, Instant::now());
            }
            Action::CancelSynthesis(ids) => self.tts.cancel(&ids),
            Action::Finalize => {
                self.caller.stt.send(SttInput::Finalize);
            }
            Action::StartBrain { history } => self.start_brain(history),
            Action::CancelBrain => {
                self.end_brain_turn();
                self.llm = None;
            }
            Action::Event(kind, detail) => self.event(kind, detail),
            Action::Persist(i) => self.persist(i),
            Action::ReplyLatency(us) => {
                if let Some(store) = &self.setup.log {
                    store.reply_latency(&self.setup.call_id, us);
                }
            }
            Action::HangUp(reason) => {
                self.hang_up_leg();
                *end = Some(reason);
            }
            Action::End(reason) => *end = Some(reason),
            Action::Reply { id, outcome } => {
                if let Some(reply) = self.replies.remove(&id) {
                    let _ = reply.send(outcome);
                }
            }
            Action::Transfer { id, to } => {
                info!(to = %mask_number(&to), "asking the carrier to transfer the call");
                let caller_id = self.our_number().to_string();
                return self.carrier_action(id, |leg| leg.transfer(to, caller_id));
            }
            Action::SendDtmf { id, digits } => {
                return self.carrier_action(id, |leg| leg.send_dtmf(&digits));
            }
            Action::AskTurnModel { pause } => return self.ask_turn_model(pause),
        }
        None
    }

    fn start_brain(&mut self, history: Vec<crate::provider::ChatMessage>) {
        self.end_brain_turn();
        let now = Instant::now();
        self.llm_requested = Some(now);
        // The turn this request is for: the next one while the brain speculates on it.
        let speculative = self.policy.is_speculating();
        let number = self.policy.turns() + u64::from(speculative);
        let trace = (self.trace.as_mut()).map(|t| t.brain_request(number, speculative, now));
        self.llm = Some(self.setup.providers.llm.stream(ChatTurn {
            call_id: self.setup.call_id.clone(),
            caller: crate::util::phone::known_number(self.setup.remote_party()),
            system_prompt: self.setup.system_prompt(),
            history,
            history_limits: crate::provider::history::HistoryLimits::of(&self.setup.agent),
            tools: self.setup.tools.clone(),
            call_token: self.setup.call_token.clone(),
            trace,
        }));
    }

    /// Queues a question to the end-of-turn model; the refusal when it cannot be asked.
    fn ask_turn_model(&mut self, pause: u64) -> Option<Input> {
        let refused = match &self.turn_model {
            Some(link) => link.ask(pause).err(),
            None => Some(TurnModelAnswer {
                pause,
                verdict: Verdict::Unavailable(Unavailable::Stopped),
                micros: 0,
            }),
        };
        refused.map(Input::TurnModel)
    }

    /// Runs a REST command on the call's leg in a task of its own; its answer comes back as
    /// [`Input::ActionDone`]. Without a leg (media never attached) it fails at once.
    fn carrier_action(
        &mut self,
        id: u64,
        request: impl FnOnce(&Leg) -> BoxFuture<ActionResult>,
    ) -> Option<Input> {
        let Some(leg) = &self.leg else {
            return Some(Input::ActionDone {
                id,
                result: ActionResult::Failed("the call's media stream is not available".into()),
            });
        };
        let answer = request(leg);
        let done = self.leg_done.0.clone();
        tokio::spawn(
            async move {
                let _ = done.send((id, answer.await)).await;
            }
            .in_current_span(),
        );
        None
    }

    /// Hangs up the call's leg at its carrier (if media attached); the media socket closes
    /// when the actor drops its command channel.
    pub(super) fn hang_up_leg(&self) {
        if let Some(leg) = &self.leg {
            leg.hang_up("the call ended");
        }
    }
}
